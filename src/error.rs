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

    /// The store was opened read-only (`Log::open_read_only`, `Store::open_read_only`): it
    /// takes no appends and changes no file.
    #[error("the store is open read-only")]
    ReadOnly,

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

    /// A store record in the log does not decode.
    #[error("the store record at LSN {lsn} does not decode: {source}")]
    Codec {
        /// Where the record is.
        lsn: u64,
        /// Why it does not decode.
        #[source]
        source: crate::codec::CodecError,
    },

    /// The bytes given as an encoded delta (`Store::record_atom_encoded`) are not a `Delta`.
    #[error("the encoded delta ({bytes} bytes) is not a continuum.Delta protobuf message")]
    InvalidDelta {
        /// Its length.
        bytes: usize,
    },

    /// A store record contradicts the records before it (a bug, or a log from elsewhere).
    #[error("the store record at LSN {lsn} is inconsistent with the log: {reason}")]
    InconsistentLog {
        /// Where the record is.
        lsn: u64,
        /// What it contradicts.
        reason: &'static str,
    },

    /// No run has this id or name.
    #[error("unknown run {run}")]
    UnknownRun {
        /// The run's id or name.
        run: String,
    },

    /// No atom has this id.
    #[error("unknown atom {atom}")]
    UnknownAtom {
        /// The atom.
        atom: u64,
    },

    /// A parent atom does not exist, belongs to another run, or has not started durably yet.
    #[error("atom {parent} cannot be a parent here: {reason}")]
    InvalidParent {
        /// The parent.
        parent: u64,
        /// Why not.
        reason: &'static str,
    },

    /// An atom with this key already exists in this run and agent.
    #[error("atom {atom} already exists for this run, agent and key")]
    AtomExists {
        /// The existing atom.
        atom: u64,
    },

    /// The transition is not allowed from the atom's status.
    #[error("atom {atom} cannot go from {from} to {to}")]
    InvalidTransition {
        /// The atom.
        atom: u64,
        /// Its status.
        from: &'static str,
        /// The refused transition.
        to: &'static str,
    },

    /// The run has finished; it takes no new atoms.
    #[error("run {run} has finished")]
    RunFinished {
        /// The run.
        run: u64,
    },

    /// The run is suspended ([`Store::suspend`](crate::Store::suspend)): it takes no new
    /// atoms, rollbacks or forks, and cannot be suspended again, until it is resumed.
    #[error("run {run} is suspended (suspension {suspension}); resume it first")]
    RunSuspended {
        /// The run.
        run: u64,
        /// The number of its suspension.
        suspension: u64,
    },

    /// The call needs a suspended run and this run is not suspended.
    #[error("run {run} is not suspended")]
    NotSuspended {
        /// The run.
        run: u64,
    },

    /// No pending request of the run's current suspension has this tool call id.
    #[error("run {run} has no pending request {request:?}")]
    UnknownRequest {
        /// The run.
        run: u64,
        /// The tool call id asked for.
        request: String,
    },

    /// The request was decided before, differently; the recorded decision stands.
    #[error("request {request:?} of run {run} was already {} by {decided_by:?}", if *approved { "approved" } else { "rejected" })]
    AlreadyDecided {
        /// The run.
        run: u64,
        /// The tool call id.
        request: String,
        /// Whether the recorded decision approved it.
        approved: bool,
        /// Who took the recorded decision.
        decided_by: String,
    },

    /// The run cannot resume while requests wait for a decision.
    #[error("run {run} has undecided requests: {open:?}")]
    UndecidedRequests {
        /// The run.
        run: u64,
        /// The tool call ids still open.
        open: Vec<String>,
    },

    /// The request was rejected: its tool call never runs.
    #[error("request {request:?} of run {run} was rejected; its tool call never runs")]
    RequestRejected {
        /// The run.
        run: u64,
        /// The tool call id.
        request: String,
    },

    /// An atom's work failed (now, or for good in an earlier attempt).
    #[error("atom {atom} failed: {message}")]
    AtomFailed {
        /// The atom.
        atom: u64,
        /// Its error message.
        message: String,
        /// Whether running it again may succeed.
        retryable: bool,
    },

    /// An atom's work succeeded in [`Store::execute`](crate::Store::execute), and its
    /// completion could not be recorded (`source` says why; after an I/O failure the store is
    /// poisoned until reopened). The work's output is handed back, so that it need not be
    /// computed again: after a reopen, `execute` the same step with a closure returning it,
    /// or `record_atom` it.
    #[error("atom {atom} completed, and its output was not recorded: {source}")]
    OutputNotRecorded {
        /// The atom.
        atom: u64,
        /// What the work produced.
        output: Box<crate::store::AtomOutput>,
        /// Why the completion was not recorded.
        #[source]
        source: Box<Error>,
    },

    /// A guarded side effect started but its outcome was never recorded (a crash, or another
    /// thread running it now): it may or may not have happened. Check with the external system
    /// using the key, then record the outcome with `Store::resolve_guard`.
    #[error("the side effect guarded by {key:?} may or may not have run")]
    GuardInDoubt {
        /// The idempotency key.
        key: String,
    },

    /// A guarded side effect failed, as its closure reported (now, or for good in an earlier
    /// call). A retryable failure left the key free: the next call runs the effect again. One
    /// that is not retryable is the key's recorded outcome: every later call returns it.
    #[error("the side effect guarded by {key:?} failed: {message}")]
    GuardFailed {
        /// The idempotency key.
        key: String,
        /// The effect's error message.
        message: String,
        /// Whether the key was left free for another attempt.
        retryable: bool,
    },

    /// `Store::resolve_guard` was given a key with no side effect in doubt: none was started
    /// under it, or its outcome is already recorded (and stays as it is).
    #[error("no side effect guarded by {key:?} is in doubt")]
    GuardNotInDoubt {
        /// The key given.
        key: String,
    },

    /// Two different keys hash alike in the in-memory index (about one chance in 10^8 per
    /// million atoms); the second cannot be stored.
    #[error("the key {key:?} collides with another key in the store's index")]
    KeyCollision {
        /// The key that could not be stored.
        key: String,
    },

    /// Only a sealed segment can be rewritten; `first_lsn` names no sealed segment.
    #[error("no sealed segment starts at LSN {first_lsn}")]
    NotSealed {
        /// The first LSN that was asked for.
        first_lsn: u64,
    },

    /// The history needed to rebuild this atom's context was reclaimed by retention: it is
    /// older than the oldest snapshot kept for its agent (see `docs/ARCHITECTURE.md`,
    /// "Retention and compaction").
    #[error("the history needed to rebuild atom {atom} was reclaimed (atom {reclaimed}'s delta is gone)")]
    HistoryReclaimed {
        /// The atom whose context was asked for.
        atom: u64,
        /// An atom on its ancestry whose delta was reclaimed.
        reclaimed: u64,
    },

    /// Evidence shows that acknowledged records existed past the end of the log (an index
    /// index snapshot or a snapshot of this store written after them), refused under
    /// [`RecoveryMode::Strict`](crate::RecoveryMode::Strict); the other modes open the store
    /// and report the loss in `Store::recovery_report`.
    #[error("records were lost from the end of the log (it ends at LSN {log_end}): {evidence}")]
    RecordsLost {
        /// The first piece of evidence found.
        evidence: crate::store::LossEvidence,
        /// The LSN after the log's last record.
        log_end: u64,
    },

    /// A configuration value, or a combination of values, is not allowed.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// Which value is wrong, and why.
        reason: String,
    },

    /// An argument of a call is not one it can take (LSNs out of order, a call that needs an
    /// option the log was opened without); nothing was changed.
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// Which argument is wrong, and why.
        reason: String,
    },

    /// A consuming atom's completion found its consumer's offset moved since the atom read it:
    /// another atom of the same consumer consumed meanwhile. Nothing of the atom was recorded.
    #[error("consumer {consumer:?} of channel {channel:?} is at message {found}, not {expected} as the atom read it")]
    ConsumerConflict {
        /// The channel.
        channel: String,
        /// The consumer.
        consumer: String,
        /// The offset the atom read (the last message id consumed before it).
        expected: u64,
        /// The offset found at its completion.
        found: u64,
    },

    /// An atom's commit found a shared-state key it read at a version that is no longer the
    /// key's newest: another atom wrote the key meanwhile. Nothing of the atom was recorded;
    /// it can be executed again with a fresh read ([`Store::execute_retrying`](crate::Store::execute_retrying)).
    #[error("state key {key:?} is at version {found}, not {expected} as the atom read it")]
    Conflict {
        /// The key's name.
        key: String,
        /// The version the atom read (0: the key had never been written).
        expected: u64,
        /// The version found at its commit.
        found: u64,
    },

    /// A run checkpoint's sequence is not greater than the run's newest checkpoint's: a stale
    /// writer cannot overwrite a newer checkpoint. Nothing was written.
    #[error("checkpoint {sequence} of run {run} is stale: its newest checkpoint is {newest}")]
    StaleCheckpoint {
        /// The run.
        run: u64,
        /// The sequence the writer asked for.
        sequence: u64,
        /// The sequence of the run's newest checkpoint.
        newest: u64,
    },

    /// The store was asked to stop ([`Store::request_stop`](crate::Store::request_stop)): it
    /// begins no new atom. Atoms begun before the request may still end, and completed atoms
    /// still replay. Nothing was written.
    #[error("the store is stopping: run {run} begins no new atom")]
    Stopping {
        /// The run the refused atom belonged to.
        run: u64,
    },

    /// A graceful stop ran out of its time budget
    /// ([`graceful_stop`](crate::shutdown::graceful_stop)): atoms were still in flight, or the
    /// run checkpoints were not all written. Every acknowledged atom is durable all the same.
    #[error(
        "the graceful stop ran out of its budget with {atoms_in_flight} atoms in flight and {checkpoints_written} checkpoints written"
    )]
    StopBudgetExceeded {
        /// Atoms begun and not ended when the budget ran out.
        atoms_in_flight: u64,
        /// Run checkpoints written before it ran out.
        checkpoints_written: u64,
    },

    /// No chain of registered migrations leads from a checkpoint's pipeline version to the
    /// version asked for. Nothing was recorded.
    #[error("no migration leads from pipeline version {from:?} to {to:?}")]
    NoMigrationPath {
        /// The checkpoint's version.
        from: String,
        /// The version asked for.
        to: String,
    },

    /// A migration returned an error or panicked. Nothing was recorded; the stored checkpoint
    /// is as it was.
    #[error("the migration from pipeline version {from:?} to {to:?} failed: {message}")]
    MigrationFailed {
        /// The version the failed step migrates from.
        from: String,
        /// The version it migrates to.
        to: String,
        /// Its error, or the panic's message.
        message: String,
        /// Whether it panicked.
        panicked: bool,
    },

    /// A bound the on-disk format or the index sets (`limits.rs`) was reached: more atoms
    /// than atom ids, a segment rewritten more times than its generation counts, a file
    /// larger than its limit. Nothing was written; the store stays usable for what fits.
    #[error("limit reached: {what} (at most {limit})")]
    LimitExceeded {
        /// What ran out, as a phrase.
        what: String,
        /// The bound.
        limit: u64,
    },

    /// Another unexpired lease holds the run ([`Store::acquire_lease`](crate::Store::acquire_lease)):
    /// a grant, or a completion of an atom of the run that does not present the lease's token,
    /// is refused. Nothing was written.
    #[error("run {run} is leased to {holder:?} (token {token}) until unix microsecond {expires_at_unix_us}")]
    LeaseHeld {
        /// The run.
        run: u64,
        /// The lease's holder.
        holder: String,
        /// The lease's fencing token.
        token: u64,
        /// When the lease expires, in microseconds since the Unix epoch (wall clock).
        expires_at_unix_us: u64,
    },

    /// A lease's token is no longer the run's current one, or the lease expired: its holder
    /// lost the run and may not write under it. Nothing was written.
    #[error("the lease of run {run} with token {token} is stale: the run's current token is {current}")]
    StaleLease {
        /// The run.
        run: u64,
        /// The token presented.
        token: u64,
        /// The run's newest granted token (equal to `token` when the lease expired).
        current: u64,
    },

    /// Another host took the store over (it won the conditional write of the shipped
    /// manifest, `docs/ARCHITECTURE.md`, "Object storage"): this owner's epoch is stale, its
    /// store is read-only from now on and nothing it writes is shipped.
    #[error("the store was taken over by another owner: epoch {epoch} is stale (the bucket's epoch is {current})")]
    Fenced {
        /// This owner's epoch.
        epoch: u64,
        /// The bucket's epoch when the takeover was seen (0 if unknown).
        current: u64,
    },

    /// The object store refused or failed an operation (network, permissions, a missing
    /// object the manifest lists); shipping retries, restore gives up.
    #[error("object store {op} of {key:?} failed: {message}")]
    ObjectStore {
        /// What was attempted (`get`, `put`, `list`, ...).
        op: &'static str,
        /// The object's key.
        key: String,
        /// The client's description of the failure.
        message: String,
    },

    /// A downloaded object's SHA-256 is not the one its manifest lists, twice in a row: the
    /// object is damaged in the bucket.
    #[error("shipped object {key:?} is damaged: its SHA-256 is not the manifest's")]
    DamagedObject {
        /// The object's key.
        key: String,
    },

    /// The connection to a store's server ([`serve::Client`](crate::serve::Client)) is
    /// closed: the server stopped or died, or an earlier call broke the connection. An atom
    /// in flight did not complete through it; connect again.
    #[error("the connection to the store's server at {} is closed", path.display())]
    Disconnected {
        /// The socket's path.
        path: PathBuf,
    },

    /// A peer on a store's socket sent bytes that are no message of the protocol: a frame
    /// longer than [`SERVE_FRAME_BYTES_MAX`](crate::limits::SERVE_FRAME_BYTES_MAX), a
    /// truncated frame, an unknown tag, or a message out of turn. The connection is closed.
    #[error("protocol error on the store's socket: {reason}")]
    Protocol {
        /// What is wrong.
        reason: String,
    },

    /// A client and a store's server speak different protocol versions: they refuse each
    /// other at the first message.
    #[error("the client speaks protocol version {client} and the server version {server}")]
    ProtocolVersion {
        /// The client's version.
        client: u32,
        /// The server's version.
        server: u32,
    },

    /// The store's server refused a call with an error the protocol carries as its message
    /// only (the errors a caller handles keep their own variant).
    #[error("the store's server refused the call: {message}")]
    Remote {
        /// The server's error, as a sentence.
        message: String,
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
    /// The log manifest (`log.manifest`) does not verify.
    #[error("the log manifest is invalid ({reason})")]
    BadManifest {
        /// What about the manifest is wrong.
        reason: &'static str,
    },
    /// A segment is an older copy of the one the log manifest lists (a rewrite it replaced),
    /// or another segment under the same name.
    #[error(
        "the segment is not the one the log manifest lists (sequence {found_seq} generation {found_generation}, \
         listed sequence {listed_seq} generation {listed_generation})"
    )]
    StaleSegment {
        /// The sequence number the manifest lists.
        listed_seq: u64,
        /// The segment's sequence number.
        found_seq: u64,
        /// The generation the manifest lists.
        listed_generation: u32,
        /// The segment's generation.
        found_generation: u32,
    },
    /// Evidence that acknowledged records existed past the end of the log (a deleted or
    /// shortened segment), refused in strict recovery.
    #[error("records are lost from the log: {evidence} (LSNs from {from_lsn}, at least up to {to_lsn})")]
    RecordsLost {
        /// What shows it.
        evidence: crate::log::LossEvidence,
        /// The first LSN lost.
        from_lsn: u64,
        /// The LSN after the last one known lost (equal to `from_lsn` when unknown).
        to_lsn: u64,
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
            Error::ReadOnly => Error::ReadOnly,
            Error::RecordTooLarge { bytes, max } => Error::RecordTooLarge { bytes: *bytes, max: *max },
            Error::BatchTooLarge { records, bytes, records_max, bytes_max } => Error::BatchTooLarge {
                records: *records,
                bytes: *bytes,
                records_max: *records_max,
                bytes_max: *bytes_max,
            },
            Error::EmptyBatch => Error::EmptyBatch,
            Error::InvalidConfig { reason } => Error::InvalidConfig { reason: reason.clone() },
            Error::InvalidArgument { reason } => Error::InvalidArgument { reason: reason.clone() },
            Error::LimitExceeded { what, limit } => Error::LimitExceeded { what: what.clone(), limit: *limit },
            Error::LeaseHeld { run, holder, token, expires_at_unix_us } => Error::LeaseHeld {
                run: *run,
                holder: holder.clone(),
                token: *token,
                expires_at_unix_us: *expires_at_unix_us,
            },
            Error::StaleLease { run, token, current } => {
                Error::StaleLease { run: *run, token: *token, current: *current }
            }
            Error::Fenced { epoch, current } => Error::Fenced { epoch: *epoch, current: *current },
            Error::ObjectStore { op, key, message } => {
                Error::ObjectStore { op, key: key.clone(), message: message.clone() }
            }
            Error::DamagedObject { key } => Error::DamagedObject { key: key.clone() },
            Error::NotSealed { first_lsn } => Error::NotSealed { first_lsn: *first_lsn },
            Error::HistoryReclaimed { atom, reclaimed } => {
                Error::HistoryReclaimed { atom: *atom, reclaimed: *reclaimed }
            }
            Error::Codec { lsn, source } => Error::Codec { lsn: *lsn, source: source.clone() },
            Error::InconsistentLog { lsn, reason } => Error::InconsistentLog { lsn: *lsn, reason },
            Error::InvalidDelta { bytes } => Error::InvalidDelta { bytes: *bytes },
            Error::UnknownRun { run } => Error::UnknownRun { run: run.clone() },
            Error::UnknownAtom { atom } => Error::UnknownAtom { atom: *atom },
            Error::InvalidParent { parent, reason } => Error::InvalidParent { parent: *parent, reason },
            Error::AtomExists { atom } => Error::AtomExists { atom: *atom },
            Error::InvalidTransition { atom, from, to } => Error::InvalidTransition { atom: *atom, from, to },
            Error::RunFinished { run } => Error::RunFinished { run: *run },
            Error::ConsumerConflict { channel, consumer, expected, found } => Error::ConsumerConflict {
                channel: channel.clone(),
                consumer: consumer.clone(),
                expected: *expected,
                found: *found,
            },
            Error::Conflict { key, expected, found } => {
                Error::Conflict { key: key.clone(), expected: *expected, found: *found }
            }
            Error::StaleCheckpoint { run, sequence, newest } => {
                Error::StaleCheckpoint { run: *run, sequence: *sequence, newest: *newest }
            }
            Error::Stopping { run } => Error::Stopping { run: *run },
            Error::StopBudgetExceeded { atoms_in_flight, checkpoints_written } => Error::StopBudgetExceeded {
                atoms_in_flight: *atoms_in_flight,
                checkpoints_written: *checkpoints_written,
            },
            Error::NoMigrationPath { from, to } => Error::NoMigrationPath { from: from.clone(), to: to.clone() },
            Error::MigrationFailed { from, to, message, panicked } => Error::MigrationFailed {
                from: from.clone(),
                to: to.clone(),
                message: message.clone(),
                panicked: *panicked,
            },
            Error::RunSuspended { run, suspension } => Error::RunSuspended { run: *run, suspension: *suspension },
            Error::NotSuspended { run } => Error::NotSuspended { run: *run },
            Error::UnknownRequest { run, request } => Error::UnknownRequest { run: *run, request: request.clone() },
            Error::AlreadyDecided { run, request, approved, decided_by } => Error::AlreadyDecided {
                run: *run,
                request: request.clone(),
                approved: *approved,
                decided_by: decided_by.clone(),
            },
            Error::UndecidedRequests { run, open } => Error::UndecidedRequests { run: *run, open: open.clone() },
            Error::RequestRejected { run, request } => Error::RequestRejected { run: *run, request: request.clone() },
            Error::AtomFailed { atom, message, retryable } => {
                Error::AtomFailed { atom: *atom, message: message.clone(), retryable: *retryable }
            }
            Error::OutputNotRecorded { atom, output, source } => {
                Error::OutputNotRecorded { atom: *atom, output: output.clone(), source: Box::new(source.replicate()) }
            }
            Error::GuardInDoubt { key } => Error::GuardInDoubt { key: key.clone() },
            Error::GuardFailed { key, message, retryable } => {
                Error::GuardFailed { key: key.clone(), message: message.clone(), retryable: *retryable }
            }
            Error::GuardNotInDoubt { key } => Error::GuardNotInDoubt { key: key.clone() },
            Error::KeyCollision { key } => Error::KeyCollision { key: key.clone() },
            Error::RecordsLost { evidence, log_end } => {
                Error::RecordsLost { evidence: evidence.clone(), log_end: *log_end }
            }
            Error::Disconnected { path } => Error::Disconnected { path: path.clone() },
            Error::Protocol { reason } => Error::Protocol { reason: reason.clone() },
            Error::ProtocolVersion { client, server } => Error::ProtocolVersion { client: *client, server: *server },
            Error::Remote { message } => Error::Remote { message: message.clone() },
        }
    }
}
