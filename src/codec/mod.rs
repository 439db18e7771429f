//! The store's record codec: protobuf messages generated from `continuum.proto`, wrapped in an
//! envelope (`envelope.rs`) that names the record kind and schema version, compressed with zstd
//! and, once the store has trained one, a dictionary made from its own records.
//!
//! Encoding and decoding are pure: the `Codec` holds only dictionaries and reusable zstd
//! contexts. Decoding any bytes returns a record or a [`CodecError`], never panics, and never
//! allocates more than [`limits::RECORD_DECOMPRESSED_BYTES_MAX`].

mod compressors;
pub mod context;
pub(crate) mod delta_check;
pub(crate) mod delta_view;
pub(crate) mod envelope;
mod fields;
pub(crate) mod wire;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use prost::Message;

use crate::limits;
use crate::metrics::EncodedBytes;
use envelope::Compression;

/// Messages generated from `src/codec/continuum.proto` by prost.
#[allow(missing_docs, clippy::all, reason = "generated code")]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/continuum.v1.rs"));
}

/// Why bytes are not a valid store record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Fewer bytes than the envelope needs.
    #[error("the record is truncated")]
    Truncated,
    /// A field of the envelope is invalid.
    #[error("the record envelope is malformed: {0}")]
    Malformed(&'static str),
    /// The record kind is unknown to this version.
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    /// The kind's schema version is newer than this version can read.
    #[error("record kind {kind} has schema version {version}, newer than the supported {supported}")]
    UnsupportedVersion {
        /// The record kind.
        kind: u8,
        /// Its schema version in the record.
        version: u8,
        /// The newest version this build reads.
        supported: u8,
    },
    /// The record names a dictionary the store does not have.
    #[error("the record needs compression dictionary {0}, which the store does not have")]
    UnknownDictionary(u32),
    /// A declared length exceeds the limit.
    #[error("the record declares {bytes} bytes, more than the maximum of {max}")]
    TooLarge {
        /// The declared length.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The zstd frame does not decompress to exactly the declared length.
    #[error("the record does not decompress")]
    Decompress,
    /// The protobuf body does not decode.
    #[error("the record's protobuf body does not decode")]
    Protobuf,
}

/// Whether `delta` is the protobuf encoding of a [`proto::Delta`], as prost decodes it (and as
/// replay then reads it): checked in place for the encodings this crate and prost write, by
/// decoding it with prost for any other.
pub(crate) fn check_encoded_delta(delta: &[u8]) -> bool {
    delta_check::check_delta(delta).is_ok() || proto::Delta::decode(delta).is_ok()
}

/// Every record the store writes, decoded.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum StoreRecord {
    /// A run was created.
    RunCreated(proto::RunCreated),
    /// An atom started.
    AtomStarted(proto::AtomStarted),
    /// An atom completed.
    AtomCompleted(proto::AtomCompleted),
    /// An atom failed.
    AtomFailed(proto::AtomFailed),
    /// A run ended.
    RunTerminal(proto::RunTerminal),
    /// A guarded side effect is about to run.
    GuardStarted(proto::GuardStarted),
    /// A guarded side effect ran.
    GuardCompleted(proto::GuardCompleted),
    /// A guarded side effect failed.
    GuardFailed(proto::GuardFailed),
    /// A compression dictionary.
    Dictionary(proto::CompressionDictionary),
    /// A rollback: atoms after one atom of an agent were abandoned.
    AtomsAbandoned(proto::AtomsAbandoned),
    /// An atom completed, and compaction has since reclaimed its delta (its result stays):
    /// what a rewritten segment holds in place of an [`StoreRecord::AtomCompleted`].
    AtomReclaimed(proto::AtomCompleted),
    /// Retention dropped a finished run.
    RunDropped(proto::RunDropped),
    /// An atom was pinned or unpinned.
    AtomPinned(proto::AtomPinned),
    /// A compaction round released atoms no rebuild can reach any more.
    HistoryReleased(proto::HistoryReleased),
}

/// The kind of a store record, as the codec's `peek` reports it from the envelope alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordKind {
    /// [`StoreRecord::RunCreated`].
    RunCreated,
    /// [`StoreRecord::AtomStarted`].
    AtomStarted,
    /// [`StoreRecord::AtomCompleted`].
    AtomCompleted,
    /// [`StoreRecord::AtomFailed`].
    AtomFailed,
    /// [`StoreRecord::RunTerminal`].
    RunTerminal,
    /// [`StoreRecord::GuardStarted`].
    GuardStarted,
    /// [`StoreRecord::GuardCompleted`].
    GuardCompleted,
    /// [`StoreRecord::GuardFailed`].
    GuardFailed,
    /// [`StoreRecord::Dictionary`].
    Dictionary,
    /// [`StoreRecord::AtomsAbandoned`].
    AtomsAbandoned,
    /// [`StoreRecord::AtomReclaimed`].
    AtomReclaimed,
    /// [`StoreRecord::RunDropped`].
    RunDropped,
    /// [`StoreRecord::AtomPinned`].
    AtomPinned,
    /// [`StoreRecord::HistoryReleased`].
    HistoryReleased,
}

impl RecordKind {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            kind::RUN_CREATED => RecordKind::RunCreated,
            kind::ATOM_STARTED => RecordKind::AtomStarted,
            kind::ATOM_COMPLETED => RecordKind::AtomCompleted,
            kind::ATOM_FAILED => RecordKind::AtomFailed,
            kind::RUN_TERMINAL => RecordKind::RunTerminal,
            kind::GUARD_STARTED => RecordKind::GuardStarted,
            kind::GUARD_COMPLETED => RecordKind::GuardCompleted,
            kind::DICTIONARY => RecordKind::Dictionary,
            kind::ATOMS_ABANDONED => RecordKind::AtomsAbandoned,
            kind::ATOM_RECLAIMED => RecordKind::AtomReclaimed,
            kind::RUN_DROPPED => RecordKind::RunDropped,
            kind::ATOM_PINNED => RecordKind::AtomPinned,
            kind::HISTORY_RELEASED => RecordKind::HistoryReleased,
            kind::GUARD_FAILED => RecordKind::GuardFailed,
            _ => return None,
        })
    }
}

/// Record kinds as stored in the envelope; numbers are never reused.
mod kind {
    pub const RUN_CREATED: u8 = 1;
    pub const ATOM_STARTED: u8 = 2;
    pub const ATOM_COMPLETED: u8 = 3;
    pub const ATOM_FAILED: u8 = 4;
    pub const RUN_TERMINAL: u8 = 5;
    pub const GUARD_STARTED: u8 = 6;
    pub const GUARD_COMPLETED: u8 = 7;
    pub const DICTIONARY: u8 = 8;
    pub const ATOMS_ABANDONED: u8 = 9;
    pub const ATOM_RECLAIMED: u8 = 10;
    pub const RUN_DROPPED: u8 = 11;
    pub const ATOM_PINNED: u8 = 12;
    pub const HISTORY_RELEASED: u8 = 13;
    pub const GUARD_FAILED: u8 = 14;
}

/// The schema version every kind is written with today; readers accept this and older.
const SCHEMA_VERSION: u8 = 1;

impl StoreRecord {
    fn kind(&self) -> u8 {
        match self {
            StoreRecord::RunCreated(_) => kind::RUN_CREATED,
            StoreRecord::AtomStarted(_) => kind::ATOM_STARTED,
            StoreRecord::AtomCompleted(_) => kind::ATOM_COMPLETED,
            StoreRecord::AtomFailed(_) => kind::ATOM_FAILED,
            StoreRecord::RunTerminal(_) => kind::RUN_TERMINAL,
            StoreRecord::GuardStarted(_) => kind::GUARD_STARTED,
            StoreRecord::GuardCompleted(_) => kind::GUARD_COMPLETED,
            StoreRecord::Dictionary(_) => kind::DICTIONARY,
            StoreRecord::AtomsAbandoned(_) => kind::ATOMS_ABANDONED,
            StoreRecord::AtomReclaimed(_) => kind::ATOM_RECLAIMED,
            StoreRecord::RunDropped(_) => kind::RUN_DROPPED,
            StoreRecord::AtomPinned(_) => kind::ATOM_PINNED,
            StoreRecord::HistoryReleased(_) => kind::HISTORY_RELEASED,
            StoreRecord::GuardFailed(_) => kind::GUARD_FAILED,
        }
    }

    /// What the record is about: the atom, run or dictionary number; 0 for guard records.
    pub fn subject(&self) -> u64 {
        match self {
            StoreRecord::RunCreated(m) => m.run,
            StoreRecord::AtomStarted(m) => m.atom,
            StoreRecord::AtomCompleted(m) => m.atom,
            StoreRecord::AtomFailed(m) => m.atom,
            StoreRecord::RunTerminal(m) => m.run,
            StoreRecord::GuardStarted(_) | StoreRecord::GuardCompleted(_) | StoreRecord::GuardFailed(_) => 0,
            StoreRecord::Dictionary(m) => u64::from(m.id),
            StoreRecord::AtomsAbandoned(m) => m.after_atom,
            StoreRecord::AtomReclaimed(m) => m.atom,
            StoreRecord::RunDropped(m) => m.run,
            StoreRecord::AtomPinned(m) => m.atom,
            StoreRecord::HistoryReleased(_) => 0,
        }
    }

    fn encode_body(&self) -> Vec<u8> {
        match self {
            StoreRecord::RunCreated(m) => m.encode_to_vec(),
            StoreRecord::AtomStarted(m) => m.encode_to_vec(),
            StoreRecord::AtomCompleted(m) => m.encode_to_vec(),
            StoreRecord::AtomFailed(m) => m.encode_to_vec(),
            StoreRecord::RunTerminal(m) => m.encode_to_vec(),
            StoreRecord::GuardStarted(m) => m.encode_to_vec(),
            StoreRecord::GuardCompleted(m) => m.encode_to_vec(),
            StoreRecord::Dictionary(m) => m.encode_to_vec(),
            StoreRecord::AtomsAbandoned(m) => m.encode_to_vec(),
            StoreRecord::AtomReclaimed(m) => m.encode_to_vec(),
            StoreRecord::RunDropped(m) => m.encode_to_vec(),
            StoreRecord::AtomPinned(m) => m.encode_to_vec(),
            StoreRecord::HistoryReleased(m) => m.encode_to_vec(),
            StoreRecord::GuardFailed(m) => m.encode_to_vec(),
        }
    }

    fn decode_body(kind: u8, body: &[u8]) -> Result<Self, CodecError> {
        let record = match kind {
            kind::RUN_CREATED => StoreRecord::RunCreated(decode_message(body)?),
            kind::ATOM_STARTED => StoreRecord::AtomStarted(decode_message(body)?),
            kind::ATOM_COMPLETED => StoreRecord::AtomCompleted(decode_message(body)?),
            kind::ATOM_FAILED => StoreRecord::AtomFailed(decode_message(body)?),
            kind::RUN_TERMINAL => StoreRecord::RunTerminal(decode_message(body)?),
            kind::GUARD_STARTED => StoreRecord::GuardStarted(decode_message(body)?),
            kind::GUARD_COMPLETED => StoreRecord::GuardCompleted(decode_message(body)?),
            kind::DICTIONARY => StoreRecord::Dictionary(decode_message(body)?),
            kind::ATOMS_ABANDONED => StoreRecord::AtomsAbandoned(decode_message(body)?),
            kind::ATOM_RECLAIMED => StoreRecord::AtomReclaimed(decode_message(body)?),
            kind::RUN_DROPPED => StoreRecord::RunDropped(decode_message(body)?),
            kind::ATOM_PINNED => StoreRecord::AtomPinned(decode_message(body)?),
            kind::HISTORY_RELEASED => StoreRecord::HistoryReleased(decode_message(body)?),
            kind::GUARD_FAILED => StoreRecord::GuardFailed(decode_message(body)?),
            other => return Err(CodecError::UnknownKind(other)),
        };
        Ok(record)
    }
}

fn decode_message<M: Message + Default>(body: &[u8]) -> Result<M, CodecError> {
    // prost bounds every allocation by the input's length, so this cannot over-allocate.
    M::decode(body).map_err(|_| CodecError::Protobuf)
}

/// An envelope storing its body plain: the header, then the `body_len` bytes `put_body` writes.
fn plain_envelope(kind: u8, subject: u64, body_len: usize, put_body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(envelope::ENVELOPE_HEADER_BYTES + 10 + body_len);
    put_plain_envelope(&mut out, kind, subject, body_len, put_body);
    out
}

/// [`plain_envelope`] appended to `out`; returns the envelope's length.
fn put_plain_envelope(
    out: &mut Vec<u8>,
    kind: u8,
    subject: u64,
    body_len: usize,
    put_body: impl FnOnce(&mut Vec<u8>),
) -> usize {
    let start = out.len();
    envelope::write_header(out, kind, SCHEMA_VERSION, subject, Compression::None);
    let header_end = out.len();
    put_body(out);
    debug_assert_eq!(out.len() - header_end, body_len, "the body's length was computed before it was written");
    out.len() - start
}

/// The parts of an `AtomStarted` record, borrowed from the caller ([`Codec::encode_start`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StartParts<'a> {
    pub atom: u64,
    pub run: u64,
    pub agent: &'a str,
    pub key: &'a str,
    pub parents: &'a [crate::ids::AtomId],
    pub idempotency_key: &'a str,
    pub started_at_unix_us: u64,
}

impl StartParts<'_> {
    /// About the length of the start record these parts make, plain (a sizing hint, at most
    /// a little over).
    pub fn len_guess(&self) -> usize {
        // The envelope's header and subject varint; three `uint64` fields (a tag and up to ten
        // bytes each); four length-delimited fields (a tag and a length of up to five bytes).
        const FIXED: usize = envelope::ENVELOPE_HEADER_BYTES + 10 + 3 * 11 + 4 * 6;
        FIXED + self.agent.len() + self.key.len() + self.idempotency_key.len() + self.parents.len() * 10
    }
}

/// Dictionaries and reusable zstd contexts. `Sync`: shared by every thread of a store.
#[derive(Default)]
pub(crate) struct Codec {
    /// Every dictionary the store has, by id.
    dictionaries: RwLock<HashMap<u32, Arc<[u8]>>>,
    /// The dictionary new records are compressed with.
    current: RwLock<Option<u32>>,
    compressors: compressors::Compressors,
    decompressors: Mutex<Vec<(Option<u32>, zstd::bulk::Decompressor<'static>)>>,
    /// The smallest body compressed when encoded.
    compress_from: CompressFrom,
    /// Bytes of protobuf bodies encoded, and of the envelopes written for them (metrics).
    encoded: EncodedBytes,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec").field("dictionaries", &self.dictionaries.read().len()).finish()
    }
}

/// The smallest record body a codec compresses (default `COMPRESSION_MIN_BYTES`).
#[derive(Clone, Copy, Debug)]
struct CompressFrom(usize);

impl Default for CompressFrom {
    fn default() -> Self {
        Self(limits::COMPRESSION_MIN_BYTES)
    }
}

impl Codec {
    /// A codec that compresses record bodies of at least `bytes` bytes (those zstd shrinks);
    /// smaller ones are stored plain. Decoding is the same for every codec.
    pub fn compressing_from(bytes: usize) -> Self {
        Self { compress_from: CompressFrom(bytes), ..Self::default() }
    }

    /// The codec, counting what it encodes into `encoded` (the store's metrics series).
    pub fn counting_into(self, encoded: EncodedBytes) -> Self {
        Self { encoded, ..self }
    }

    /// Adds a dictionary (read back from the log, or just trained) and makes it current.
    pub fn add_dictionary(&self, id: u32, dictionary: &[u8]) {
        self.dictionaries.write().insert(id, Arc::from(dictionary));
        let mut current = self.current.write();
        if current.is_none_or(|now| now < id) {
            *current = Some(id);
            self.compressors.keep_only(id);
        }
    }

    /// The dictionary new records are compressed with, if any.
    pub fn current_dictionary(&self) -> Option<u32> {
        *self.current.read()
    }

    /// The length of the current dictionary, if any.
    pub fn current_dictionary_len(&self) -> Option<usize> {
        let current = self.current_dictionary()?;
        self.dictionaries.read().get(&current).map(|dictionary| dictionary.len())
    }

    /// Encodes `record` into its envelope, compressing when that makes it smaller.
    /// Dictionaries, and `AtomReclaimed` records (written by compaction at an old LSN, which may
    /// come before the current dictionary's record), are stored plain.
    pub fn encode(&self, record: &StoreRecord) -> Vec<u8> {
        let body = record.encode_body();
        let compressible = !matches!(record, StoreRecord::Dictionary(_) | StoreRecord::AtomReclaimed(_));
        self.wrap(record.kind(), record.subject(), &body, compressible)
    }

    /// Encodes an `AtomCompleted` record from borrowed parts: the same bytes as
    /// [`Codec::encode`] of the owned record, without cloning the delta on the hot path.
    pub fn encode_completion(&self, atom: u64, delta: &proto::Delta, result: &[u8], ended_at_unix_us: u64) -> Vec<u8> {
        let mut out = Vec::new();
        self.put_completion(&mut out, atom, delta, result, ended_at_unix_us);
        out
    }

    /// [`Codec::encode_completion`] appended to `out` (a batch being built in place).
    pub fn put_completion(
        &self,
        out: &mut Vec<u8>,
        atom: u64,
        delta: &proto::Delta,
        result: &[u8],
        ended_at_unix_us: u64,
    ) {
        use fields::{field_len, put_field_header, put_text, put_uint64, text_len, uint64_len};
        let delta_len = prost::Message::encoded_len(delta);
        let body_len = uint64_len(atom) + field_len(delta_len) + text_len(result) + uint64_len(ended_at_unix_us);
        self.put_written(out, kind::ATOM_COMPLETED, atom, body_len, |out| {
            put_uint64(out, 1, atom);
            put_field_header(out, 2, delta_len);
            prost::Message::encode_raw(delta, out);
            put_text(out, 3, result);
            put_uint64(out, 4, ended_at_unix_us);
        })
    }

    /// [`Codec::encode_completion`] of a delta already encoded (`delta`: its protobuf bytes,
    /// checked with [`check_encoded_delta`]): the same record, with the bytes copied in.
    pub fn encode_completion_bytes(&self, atom: u64, delta: &[u8], result: &[u8], ended_at_unix_us: u64) -> Vec<u8> {
        let mut out = Vec::new();
        self.put_completion_bytes(&mut out, atom, delta, result, ended_at_unix_us);
        out
    }

    /// [`Codec::encode_completion_bytes`] appended to `out` (a batch being built in place).
    pub fn put_completion_bytes(
        &self,
        out: &mut Vec<u8>,
        atom: u64,
        delta: &[u8],
        result: &[u8],
        ended_at_unix_us: u64,
    ) {
        use fields::{field_len, put_field_header, put_text, put_uint64, text_len, uint64_len};
        let body_len = uint64_len(atom) + field_len(delta.len()) + text_len(result) + uint64_len(ended_at_unix_us);
        self.put_written(out, kind::ATOM_COMPLETED, atom, body_len, |out| {
            put_uint64(out, 1, atom);
            put_field_header(out, 2, delta.len());
            out.extend_from_slice(delta);
            put_text(out, 3, result);
            put_uint64(out, 4, ended_at_unix_us);
        })
    }

    /// Puts the body that `put_body` writes (`body_len` bytes) in an envelope, as
    /// [`Codec::wrap`] would: a body stored plain (below the compression threshold) is written
    /// straight after the envelope's header instead of apart and then copied.
    /// Appended to `out`: a batch being built in place, or an empty buffer.
    fn put_written(
        &self,
        out: &mut Vec<u8>,
        kind: u8,
        subject: u64,
        body_len: usize,
        put_body: impl FnOnce(&mut Vec<u8>),
    ) {
        if body_len >= self.compress_from.0 {
            let mut body = Vec::with_capacity(body_len);
            put_body(&mut body);
            let wrapped = self.wrap(kind, subject, &body, true);
            if out.is_empty() {
                *out = wrapped;
            } else {
                out.extend_from_slice(&wrapped);
            }
            return;
        }
        out.reserve(envelope::ENVELOPE_HEADER_BYTES + 10 + body_len);
        let stored_len = put_plain_envelope(out, kind, subject, body_len, put_body);
        self.count_encoded(body_len, stored_len);
    }

    /// Encodes an `AtomStarted` record from borrowed parts: the same bytes as
    /// [`Codec::encode`] of the owned record (fields in number order, defaults omitted,
    /// parents packed, as prost writes them), without copying agent, key, parents and
    /// idempotency key into a record first (up to four allocations fewer per atom on the
    /// append path).
    pub fn encode_start(&self, start: &StartParts<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        self.put_start(&mut out, start);
        out
    }

    /// [`Codec::encode_start`] appended to `out` (a batch being built in place).
    pub fn put_start(&self, out: &mut Vec<u8>, start: &StartParts<'_>) {
        use fields::{field_len, put_field_header, put_text, put_uint64, put_varint, text_len, uint64_len, varint_len};
        let parents_len: usize = start.parents.iter().map(|parent| varint_len(parent.0)).sum();
        let body_len = uint64_len(start.atom)
            + uint64_len(start.run)
            + text_len(start.agent.as_bytes())
            + text_len(start.key.as_bytes())
            + if start.parents.is_empty() { 0 } else { field_len(parents_len) }
            + text_len(start.idempotency_key.as_bytes())
            + uint64_len(start.started_at_unix_us);
        self.put_written(out, kind::ATOM_STARTED, start.atom, body_len, |out| {
            put_uint64(out, 1, start.atom);
            put_uint64(out, 2, start.run);
            put_text(out, 3, start.agent.as_bytes());
            put_text(out, 4, start.key.as_bytes());
            // Packed, as proto3 writes a repeated scalar.
            if !start.parents.is_empty() {
                put_field_header(out, 5, parents_len);
                for parent in start.parents {
                    put_varint(out, parent.0);
                }
            }
            put_text(out, 6, start.idempotency_key.as_bytes());
            put_uint64(out, 7, start.started_at_unix_us);
        })
    }

    /// Bytes of protobuf bodies encoded so far, and of the envelopes they became.
    pub fn encoded_bytes(&self) -> (u64, u64) {
        self.encoded.get()
    }

    /// Puts `body` in an envelope, compressed when allowed and worthwhile.
    fn wrap(&self, kind: u8, subject: u64, body: &[u8], compressible: bool) -> Vec<u8> {
        let out = self.wrap_uncounted(kind, subject, body, compressible);
        self.count_encoded(body.len(), out.len());
        out
    }

    /// Counts an encoded body and the envelope it became ([`Codec::encoded_bytes`]).
    fn count_encoded(&self, body_len: usize, stored_len: usize) {
        self.encoded.record(body_len as u64, stored_len as u64);
    }

    fn wrap_uncounted(&self, kind: u8, subject: u64, body: &[u8], compressible: bool) -> Vec<u8> {
        if compressible
            && body.len() >= self.compress_from.0
            && let Some(out) = self.wrap_compressed(kind, subject, body)
        {
            return out;
        }
        plain_envelope(kind, subject, body.len(), |out| out.extend_from_slice(body))
    }

    /// The envelope with `body` compressed (with the current dictionary, if any) straight after
    /// its header; `None` if zstd fails or saves too little to pay for the longer header.
    fn wrap_compressed(&self, kind: u8, subject: u64, body: &[u8]) -> Option<Vec<u8>> {
        let dictionary = self.current_dictionary();
        let uncompressed_len = u32::try_from(body.len()).ok()?;
        let compression = match dictionary {
            Some(dictionary_id) => Compression::ZstdDictionary { dictionary_id, uncompressed_len },
            None => Compression::Zstd { uncompressed_len },
        };
        let bound = zstd::zstd_safe::compress_bound(body.len());
        let mut out = Vec::with_capacity(24 + bound);
        envelope::write_header(&mut out, kind, SCHEMA_VERSION, subject, compression);
        let header = out.len();
        out.resize(header + bound, 0);
        let dictionaries = |id: u32| self.dictionaries.read().get(&id).cloned();
        let written = self.compressors.compress(dictionary, dictionaries, body, &mut out[header..]);
        let written = written.filter(|written| written + 6 < body.len())?;
        out.truncate(header + written);
        Some(out)
    }

    /// Reads only the envelope: the record's kind and subject, without touching the body.
    ///
    /// # Errors
    /// A [`CodecError`] if the envelope is malformed or of an unknown kind or version.
    pub fn peek(&self, bytes: &[u8]) -> Result<(RecordKind, u64), CodecError> {
        let envelope = checked_envelope(bytes)?;
        Ok((RecordKind::from_code(envelope.kind).ok_or(CodecError::UnknownKind(envelope.kind))?, envelope.subject))
    }

    /// [`Codec::peek`], and the record's body if it is stored plain (`None` if compressed).
    ///
    /// # Errors
    /// A [`CodecError`] for a malformed envelope.
    pub(crate) fn peek_plain<'a>(&self, bytes: &'a [u8]) -> Result<(RecordKind, u64, Option<&'a [u8]>), CodecError> {
        let envelope = checked_envelope(bytes)?;
        let kind = RecordKind::from_code(envelope.kind).ok_or(CodecError::UnknownKind(envelope.kind))?;
        let plain = (envelope.compression == Compression::None).then_some(envelope.body);
        Ok((kind, envelope.subject, plain))
    }

    /// Decompresses a record's body without decoding it; returns its length (for measuring).
    ///
    /// # Errors
    /// A [`CodecError`] for any malformed input.
    pub fn decompressed_body_len(&self, bytes: &[u8]) -> Result<usize, CodecError> {
        Ok(self.body(&checked_envelope(bytes)?)?.len())
    }

    /// The envelope's protobuf body, decompressed if it was compressed.
    fn body<'a>(&self, envelope: &envelope::Envelope<'a>) -> Result<std::borrow::Cow<'a, [u8]>, CodecError> {
        let (dictionary, uncompressed_len) = match envelope.compression {
            Compression::None => return Ok(std::borrow::Cow::Borrowed(envelope.body)),
            Compression::Zstd { uncompressed_len } => (None, uncompressed_len),
            Compression::ZstdDictionary { dictionary_id, uncompressed_len } => (Some(dictionary_id), uncompressed_len),
        };
        self.decompress(dictionary, envelope.body, uncompressed_len).map(std::borrow::Cow::Owned)
    }

    /// The record `bytes` with its body stored plain (decompressed, the envelope otherwise
    /// unchanged); `None` if it is stored plain already. Cold compression stores records so,
    /// because a block of plain records compresses far better than records compressed one by
    /// one.
    ///
    /// # Errors
    /// A [`CodecError`] for a malformed envelope or body.
    pub fn plain(&self, bytes: &[u8]) -> Result<Option<Vec<u8>>, CodecError> {
        let envelope = checked_envelope(bytes)?;
        if envelope.compression == Compression::None {
            return Ok(None);
        }
        let body = self.body(&envelope)?;
        let mut out = Vec::with_capacity(envelope::ENVELOPE_HEADER_BYTES + 10 + body.len());
        envelope::write_header(&mut out, envelope.kind, envelope.schema_version, envelope.subject, Compression::None);
        out.extend_from_slice(&body);
        Ok(Some(out))
    }

    /// Decodes an envelope.
    ///
    /// # Errors
    /// A [`CodecError`] for any malformed input.
    pub fn decode(&self, bytes: &[u8]) -> Result<StoreRecord, CodecError> {
        let envelope = checked_envelope(bytes)?;
        let record = StoreRecord::decode_body(envelope.kind, &self.body(&envelope)?)?;
        if record.subject() != envelope.subject {
            return Err(CodecError::Malformed("the envelope's subject differs from the body's"));
        }
        Ok(record)
    }

    fn decompress(&self, dictionary: Option<u32>, body: &[u8], uncompressed_len: u32) -> Result<Vec<u8>, CodecError> {
        let mut decompressor = self.take_decompressor(dictionary)?;
        // The capacity bounds the output: zstd fails rather than grow past it.
        let result = decompressor.decompress(body, uncompressed_len as usize);
        self.decompressors.lock().push((dictionary, decompressor));
        match result {
            Ok(out) if out.len() == uncompressed_len as usize => Ok(out),
            _ => Err(CodecError::Decompress),
        }
    }

    fn take_decompressor(&self, dictionary: Option<u32>) -> Result<zstd::bulk::Decompressor<'static>, CodecError> {
        let mut pool = self.decompressors.lock();
        if let Some(at) = pool.iter().position(|(id, _)| *id == dictionary) {
            return Ok(pool.swap_remove(at).1);
        }
        drop(pool);
        let created = match dictionary {
            None => zstd::bulk::Decompressor::new(),
            Some(id) => {
                let bytes = self.dictionaries.read().get(&id).cloned().ok_or(CodecError::UnknownDictionary(id))?;
                zstd::bulk::Decompressor::with_dictionary(&bytes)
            }
        };
        created.map_err(|_| CodecError::Decompress)
    }
}

/// Reads records' bodies into a caller's buffer, holding one decompression context for as long
/// as it lives instead of taking one from the codec's pool for every record. Replay decodes
/// with one reader per thread and chunk.
pub(crate) struct BodyReader<'c> {
    codec: &'c Codec,
    held: Option<(Option<u32>, zstd::bulk::Decompressor<'static>)>,
}

impl Codec {
    /// A [`BodyReader`] over this codec.
    pub fn body_reader(&self) -> BodyReader<'_> {
        BodyReader { codec: self, held: None }
    }
}

impl BodyReader<'_> {
    /// Appends the body of the record `bytes` to `out`, decompressed if it was compressed;
    /// returns the record's kind and subject. On error `out` is as it was.
    ///
    /// # Errors
    /// A [`CodecError`] for a malformed envelope or a body that does not decompress to the
    /// length its envelope states.
    pub fn append_body(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(RecordKind, u64), CodecError> {
        let envelope = checked_envelope(bytes)?;
        let kind = RecordKind::from_code(envelope.kind).ok_or(CodecError::UnknownKind(envelope.kind))?;
        let (dictionary, len) = match envelope.compression {
            Compression::None => {
                out.extend_from_slice(envelope.body);
                return Ok((kind, envelope.subject));
            }
            Compression::Zstd { uncompressed_len } => (None, uncompressed_len as usize),
            Compression::ZstdDictionary { dictionary_id, uncompressed_len } => {
                (Some(dictionary_id), uncompressed_len as usize)
            }
        };
        let decompressor = self.decompressor(dictionary)?;
        let start = out.len();
        out.resize(start + len, 0);
        // The slice bounds the output: zstd fails rather than write past it.
        match decompressor.decompress_to_buffer(envelope.body, &mut out[start..]) {
            Ok(written) if written == len => Ok((kind, envelope.subject)),
            _ => {
                out.truncate(start);
                Err(CodecError::Decompress)
            }
        }
    }

    /// The body of the record `bytes`: borrowed from it when stored plain, decompressed into
    /// `scratch` otherwise (no copy for the small records stored plain, such as most starts).
    ///
    /// # Errors
    /// As [`BodyReader::append_body`].
    pub fn body<'a>(&mut self, bytes: &'a [u8], scratch: &'a mut Vec<u8>) -> Result<&'a [u8], CodecError> {
        let envelope = checked_envelope(bytes)?;
        if envelope.compression == Compression::None {
            return Ok(envelope.body);
        }
        scratch.clear();
        self.append_body(bytes, scratch)?;
        Ok(scratch)
    }

    fn decompressor(&mut self, dictionary: Option<u32>) -> Result<&mut zstd::bulk::Decompressor<'static>, CodecError> {
        if self.held.as_ref().is_none_or(|(id, _)| *id != dictionary) {
            if let Some(held) = self.held.take() {
                self.codec.decompressors.lock().push(held);
            }
            self.held = Some((dictionary, self.codec.take_decompressor(dictionary)?));
        }
        match &mut self.held {
            Some((_, decompressor)) => Ok(decompressor),
            None => Err(CodecError::Decompress),
        }
    }
}

impl Drop for BodyReader<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            self.codec.decompressors.lock().push(held);
        }
    }
}

fn checked_envelope(bytes: &[u8]) -> Result<envelope::Envelope<'_>, CodecError> {
    let envelope = envelope::parse(bytes)?;
    if RecordKind::from_code(envelope.kind).is_none() {
        return Err(CodecError::UnknownKind(envelope.kind));
    }
    if envelope.schema_version == 0 || envelope.schema_version > SCHEMA_VERSION {
        let (kind, version) = (envelope.kind, envelope.schema_version);
        return Err(CodecError::UnsupportedVersion { kind, version, supported: SCHEMA_VERSION });
    }
    Ok(envelope)
}

/// Trains a dictionary of at most `bytes` on `samples`; `None` if zstd cannot (too few or too
/// similar samples).
pub(crate) fn train_dictionary(samples: &[Vec<u8>], bytes: usize) -> Option<Vec<u8>> {
    zstd::dict::from_samples(samples, bytes).ok()
}

#[cfg(test)]
pub(crate) mod tests;
