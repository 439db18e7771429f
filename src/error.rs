//! [`Error`], the crate's one public error type, and the facts it carries.

use std::io;
use std::path::PathBuf;

/// Result with continuum's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in continuum.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file-system call failed.
    #[error("{op} failed on {}: {source}", path.display())]
    Io {
        /// The operation that failed, such as `"fdatasync"`.
        op: &'static str,
        /// The file or directory it was applied to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// The disk is full (`ENOSPC`).
    #[error("no space left on the device: {op} failed on {}", path.display())]
    NoSpace {
        /// The operation that failed.
        op: &'static str,
        /// The file or directory it was applied to.
        path: PathBuf,
    },

    /// Stored bytes are damaged.
    #[error("corruption in {} at byte offset {offset}: {kind}", segment.display())]
    Corruption {
        /// The segment file.
        segment: PathBuf,
        /// Byte offset of the damage inside that file.
        offset: u64,
        /// What is wrong.
        kind: CorruptionKind,
    },

    /// An earlier write or sync failed, so the log refuses writes until it is reopened and
    /// recovery has run. Reads still work.
    #[error("the log is poisoned: an earlier {op} failed ({kind}); reopen it to recover")]
    Poisoned {
        /// The operation whose failure poisoned the log.
        op: &'static str,
        /// The kind of that failure.
        kind: io::ErrorKind,
    },

    /// Another handle, in this process or another one, has the store open.
    #[error("the store at {} is locked by another open handle", dir.display())]
    Locked {
        /// The store directory.
        dir: PathBuf,
    },

    /// The log was closed.
    #[error("the log is closed")]
    Closed,

    /// A record is larger than the log accepts.
    #[error("a record of {bytes} bytes is larger than the maximum of {max} bytes")]
    RecordTooLarge {
        /// Size of the refused record.
        bytes: u64,
        /// The largest allowed size.
        max: u64,
    },

    /// A batch is larger, or has more records, than the log accepts.
    #[error(
        "a batch of {records} records and {bytes} bytes exceeds the maximum of {records_max} records and {bytes_max} bytes"
    )]
    BatchTooLarge {
        /// Records in the refused batch.
        records: u64,
        /// Encoded bytes of the refused batch.
        bytes: u64,
        /// The most records allowed.
        records_max: u64,
        /// The most bytes allowed.
        bytes_max: u64,
    },

    /// An empty batch was appended.
    #[error("a batch must hold at least one record")]
    EmptyBatch,

    /// A configuration value, or a combination of values, is not allowed.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// Which value is wrong, and why.
        reason: String,
    },
}

/// What is wrong with damaged bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptionKind {
    /// The segment header is unreadable: wrong magic, checksum, version or size.
    #[error("the segment header is invalid ({reason})")]
    BadSegmentHeader {
        /// What about the header is wrong.
        reason: &'static str,
    },
    /// A segment's file name does not match the first LSN in its header.
    #[error("the file name says first LSN {named} but the header says {stored}")]
    NameMismatch {
        /// LSN in the file name.
        named: u64,
        /// LSN in the header.
        stored: u64,
    },
    /// A segment belongs to another store (its store id differs from the other segments').
    #[error("the segment belongs to store {found:#018x}, not {expected:#018x}")]
    ForeignSegment {
        /// The store id of the segments before it.
        expected: u64,
        /// This segment's store id.
        found: u64,
    },
    /// Segment sequence numbers do not increase from one segment to the next.
    #[error("segment sequence {found} does not follow {previous}")]
    SequenceOrder {
        /// The previous segment's sequence number.
        previous: u64,
        /// This segment's sequence number.
        found: u64,
    },
    /// Records are missing: an LSN was expected and another one found.
    #[error("expected LSN {expected} but found {found}")]
    LsnGap {
        /// The LSN that should come next.
        expected: u64,
        /// The LSN that does.
        found: u64,
    },
    /// A batch that fails its checksum or framing is followed by valid batches, so it is not
    /// a torn tail.
    #[error("an invalid batch is followed by a valid batch at offset {next_valid_offset}")]
    InvalidBatchBeforeValid {
        /// Where the next valid batch starts.
        next_valid_offset: u64,
    },
    /// A sealed segment (not the last one) ends with invalid bytes.
    #[error("a sealed segment ends with {bytes} invalid bytes")]
    SealedSegmentTail {
        /// How many bytes after the last valid batch are not zero.
        bytes: u64,
    },
    /// The last segment ends with invalid bytes and the recovery mode is strict.
    #[error("the last segment ends with {bytes} invalid bytes (a torn tail), refused in strict recovery")]
    TornTail {
        /// How many bytes after the last valid batch are not zero.
        bytes: u64,
    },
    /// A batch read back after recovery fails its checksum.
    #[error("a batch fails its checksum: {reason}")]
    BadBatch {
        /// What about the batch is wrong.
        reason: &'static str,
    },
}

impl Error {
    /// Wraps an I/O error with the operation and path, turning `ENOSPC` into [`Error::NoSpace`].
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        if source.kind() == io::ErrorKind::StorageFull {
            Error::NoSpace { op, path }
        } else {
            Error::Io { op, path, source }
        }
    }

    /// The kind of I/O failure behind this error, if any.
    pub(crate) fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            Error::NoSpace { .. } => Some(io::ErrorKind::StorageFull),
            _ => None,
        }
    }

    /// An equal error for another member of a failed commit group (`io::Error` is not `Clone`).
    pub(crate) fn replicate(&self) -> Self {
        match self {
            Error::Io { op, path, source } => Error::Io {
                op,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::from(source.kind()),
                },
            },
            Error::NoSpace { op, path } => Error::NoSpace { op, path: path.clone() },
            Error::Corruption { segment, offset, kind } => {
                Error::Corruption { segment: segment.clone(), offset: *offset, kind: kind.clone() }
            }
            Error::Poisoned { op, kind } => Error::Poisoned { op, kind: *kind },
            Error::Locked { dir } => Error::Locked { dir: dir.clone() },
            Error::Closed => Error::Closed,
            Error::RecordTooLarge { bytes, max } => Error::RecordTooLarge { bytes: *bytes, max: *max },
            Error::BatchTooLarge { records, bytes, records_max, bytes_max } => Error::BatchTooLarge {
                records: *records,
                bytes: *bytes,
                records_max: *records_max,
                bytes_max: *bytes_max,
            },
            Error::EmptyBatch => Error::EmptyBatch,
            Error::InvalidConfig { reason } => Error::InvalidConfig { reason: reason.clone() },
        }
    }
}
