//! Every bound continuum enforces, in one place, with compile-time checks of how they relate.

/// Largest record payload accepted by [`Log::append`](crate::Log::append), in bytes.
pub const RECORD_BYTES_MAX: u32 = 16 * 1024 * 1024;

/// Largest batch payload (records plus their 4-byte length prefixes), in bytes.
pub const BATCH_BYTES_MAX: u32 = 32 * 1024 * 1024;

/// Largest decompressed store record; a declared length above it is refused before any
/// allocation, so a corrupt or hostile length can never make decompression allocate more.
pub const RECORD_DECOMPRESSED_BYTES_MAX: u32 = 16 * 1024 * 1024;

/// Largest decompressed snapshot (a context), in bytes; a snapshot declaring more is refused.
pub const SNAPSHOT_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// Most threads a context rebuild decodes deltas on.
pub const REPLAY_THREADS_MAX: usize = 16;

/// Deltas a rebuild decodes in parallel before applying them (bounds replay memory).
pub const REPLAY_CHUNK_ATOMS: usize = 2048;

/// Default for the smallest record body the store compresses as it appends it
/// (`StoreBuilder::compress_records_from`). Below about 2 KiB, zstd's fixed cost per frame
/// (2.3 µs hot, 5–6 µs with 16 threads taking turns on two cores) dominates what a record
/// saves, and cold compression stores those records far smaller once their segment is sealed
/// (`FORMAT.md` §8).
pub const COMPRESSION_MIN_BYTES: usize = 2048;

/// zstd compression level of store records.
pub const COMPRESSION_LEVEL: i32 = 3;

/// Size of the dictionary trained on a store's first `DICTIONARY_TRAINING_SAMPLES` records.
pub const DICTIONARY_BYTES: usize = 64 * 1024;

/// Records sampled before the final dictionary is trained (bounds the samples kept in memory to
/// about this many records).
pub const DICTIONARY_TRAINING_SAMPLES: usize = 2_000;

/// Size of the first, smaller dictionary, trained early so that a young store's records do not
/// wait for `DICTIONARY_TRAINING_SAMPLES` of them to compress well.
pub const DICTIONARY_FIRST_BYTES: usize = 16 * 1024;

/// Records sampled before the first dictionary is trained.
pub const DICTIONARY_FIRST_SAMPLES: usize = 256;

/// Bytes of samples kept for dictionary training at most.
pub const DICTIONARY_TRAINING_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Largest atom id (atom ids are 32-bit in the index). A record naming a higher one, or a
/// `RunDropped` record whose `next_atom` lies past `ATOM_ID_MAX + 1`, is an inconsistent log.
pub const ATOM_ID_MAX: u64 = u32::MAX as u64;

/// Largest compression dictionary id: the next id (`id + 1`) must still be a `u32`.
pub const DICTIONARY_ID_MAX: u32 = u32::MAX - 1;

/// Largest index snapshot file (`index.snapshot`) read or written, in bytes: about 16 bytes per
/// atom, so a store of some 250 million atoms. A store whose index snapshot would be larger folds
/// its whole log on open instead; a larger file found on disk is ignored without being read.
pub const INDEX_SNAPSHOT_BYTES_MAX: u64 = 4 << 30;

/// Most records in one batch.
pub const BATCH_RECORDS_MAX: u32 = 1 << 20;

/// Smallest allowed segment file.
pub const SEGMENT_BYTES_MIN: u64 = 4 * 1024;

/// Largest allowed segment file.
pub const SEGMENT_BYTES_MAX: u64 = 1024 * 1024 * 1024;

/// Most segments the log manifest lists (32 bytes each): a log of default-sized segments
/// holds 64 TiB before reaching it. The manifest is read whole, so this bounds that read.
pub const MANIFEST_SEGMENTS_MAX: usize = 1 << 20;

/// Default segment file size ([`Config::segment_bytes`](crate::Config::segment_bytes)).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// Most bytes at the end of every segment that ordinary appends leave to reserved ones
/// ([`Log::append_reserved_with`](crate::Log::append_reserved_with)): records that let space
/// be freed, so that a full disk never keeps a store from finishing and dropping runs.
pub const SEGMENT_RESERVE_BYTES_MAX: u64 = 4 * 1024;

/// The reserve at the end of a segment of `segment_bytes`: a sixteenth of its room for frames,
/// at most [`SEGMENT_RESERVE_BYTES_MAX`], a multiple of 8 (frames are 8-byte aligned).
pub const fn segment_reserve_bytes(segment_bytes: u64) -> u64 {
    // The room for frames: the segment less its 64-byte header (docs/FORMAT.md §4).
    let room = segment_bytes.saturating_sub(64);
    let reserve = if room / 16 < SEGMENT_RESERVE_BYTES_MAX { room / 16 } else { SEGMENT_RESERVE_BYTES_MAX };
    reserve / 8 * 8
}

/// Most appends waiting for the group-commit leader; further appenders block until there is room.
pub const COMMIT_QUEUE_DEPTH_MAX: usize = 4096;

/// Most frame bytes one group-commit leader writes in one `write` call.
pub const COMMIT_GROUP_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Zeros the writer writes ahead of the data in the active segment at a time, before a sync
/// (see `docs/ARCHITECTURE.md`, "Zeroing ahead").
pub const ZERO_AHEAD_CHUNK_BYTES: usize = 1024 * 1024;

/// How close a syncing group may come to the end of the zeroed space before the next chunk is
/// zeroed.
pub const ZERO_AHEAD_MARGIN_BYTES: u64 = 256 * 1024;

/// Default of [`Config::commit_spin`](crate::Config::commit_spin), in microseconds: how long an
/// appender waiting for its group's `fdatasync` yields the CPU in a loop before it sleeps.
pub const COMMIT_SPIN_US_DEFAULT: u64 = 1000;

/// Longest allowed [`Config::commit_spin`](crate::Config::commit_spin), in microseconds.
pub const COMMIT_SPIN_US_MAX: u64 = 10_000;

/// Default interval of the background flusher under [`Durability::Buffered`](crate::Durability::Buffered), in milliseconds.
pub const FLUSH_INTERVAL_MS_DEFAULT: u64 = 100;

/// Longest allowed flusher interval, in milliseconds.
pub const FLUSH_INTERVAL_MS_MAX: u64 = 60 * 60 * 1000;

/// Bytes between two entries of a segment's sparse LSN → offset index (bounds memory to about
/// 16 bytes per this many bytes of log).
pub const SPARSE_INDEX_STRIDE_BYTES: u64 = 32 * 1024;

/// Most bytes a segment reader fetches with one positioned read.
pub const READ_CHUNK_BYTES_MAX: usize = 1024 * 1024;

/// Largest encoded run checkpoint (the result of its control atom), in bytes.
pub const CHECKPOINT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Longest name in a run checkpoint (agent, position, resume hint, a key of a map, a version),
/// in bytes.
pub const CHECKPOINT_NAME_BYTES_MAX: usize = 4096;

/// Most entries in each map or list of a run checkpoint (shared context, agent heads,
/// environment, side effects).
pub const CHECKPOINT_ENTRIES_MAX: usize = 65_536;

/// Most migrations one chain applies (from a checkpoint's version to the one asked for).
pub const MIGRATION_STEPS_MAX: usize = 256;
/// Bytes of one name in a continuation (an agent, a tool call id, a tool name, who decided, a
/// suspension reason's text), from a caller or from disk.
pub const CONTINUATION_NAME_BYTES_MAX: usize = 1024;

/// Bytes of one text in a continuation (a tool call's arguments, a decision's message or edited
/// arguments), from a caller or from disk.
pub const CONTINUATION_TEXT_BYTES_MAX: usize = 1024 * 1024;

/// Levels of a continuation tree (agents and their sub-agents, all depths together).
pub const CONTINUATION_LEVELS_MAX: usize = 256;

/// Depth of a continuation tree (the root is depth 1).
pub const CONTINUATION_DEPTH_MAX: usize = 16;

/// Pending requests of one suspension (all levels together).
pub const CONTINUATION_REQUESTS_MAX: usize = 1024;

/// Bytes of one encoded suspension (the continuation tree a suspension atom's result holds).
pub const CONTINUATION_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bytes of a channel's or a consumer's name.
pub const CHANNEL_NAME_BYTES_MAX: usize = 128;

/// Bytes of one channel message's payload.
pub const CHANNEL_MESSAGE_BYTES_MAX: usize = 64 * 1024;

/// Messages one atom sends (all its channels together).
pub const CHANNEL_SENDS_PER_ATOM_MAX: usize = 128;

/// Messages one receive returns.
pub const CHANNEL_RECEIVE_MESSAGES_MAX: usize = 4096;

/// Consumer offsets an open store keeps in memory (a cache, cleared when full).
pub const CHANNEL_OFFSETS_CACHED_MAX: usize = 65_536;

/// Channels and consumers one atom receives from (each becomes an offset control atom).
pub const CHANNEL_CONSUMERS_PER_ATOM_MAX: usize = 64;

/// Bytes of a shared-state key's name.
pub const STATE_KEY_BYTES_MAX: usize = 128;

/// Bytes of one shared-state value (a put's bytes, an appended item).
pub const STATE_VALUE_BYTES_MAX: usize = 16 * 1024;

/// Writes one atom makes to shared state (each becomes a version control atom).
pub const STATE_WRITES_PER_ATOM_MAX: usize = 128;

/// Shared-state keys one atom reads or writes.
pub const STATE_KEYS_PER_ATOM_MAX: usize = 64;

/// Items of one shared-state list (its versions: a read of the list reads each of them).
pub const STATE_LIST_ITEMS_MAX: u64 = 65_536;

/// Newest versions of shared-state keys an open store keeps in memory (a cache, cleared when
/// full).
pub const STATE_VERSIONS_CACHED_MAX: usize = 65_536;

/// Bytes of a bytes key's value kept with its newest version in that cache (larger ones are
/// read from the log).
pub const STATE_VALUE_CACHED_BYTES_MAX: usize = 1024;

/// Bytes the cache of newest versions holds at most, values and names together (cleared when
/// full).
pub const STATE_CACHE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Bytes of a lease holder's name.
pub const LEASE_HOLDER_BYTES_MAX: usize = 256;

/// A lease's time to live (one day): a holder that needs longer renews.
pub const LEASE_TTL_US_MAX: u64 = 24 * 60 * 60 * 1_000_000;

/// Runs whose lease state an open store keeps in memory (a cache of the newest lease atom of
/// each run, cleared when full).
pub const LEASE_RUNS_CACHED_MAX: usize = 4096;

/// Atoms begun under a lease and not yet ended, in one open store.
pub const LEASED_ATOMS_IN_FLIGHT_MAX: usize = 65_536;

/// Locks the runs' leases are spread over (a run's completions and its grants take one).
pub const LEASE_LOCKS: usize = 64;

/// Largest frame on a store's socket (`serve`), in bytes after its 4-byte length: an atom's
/// largest record and 1 MiB of framing. A longer declared length is refused before any
/// allocation.
pub const SERVE_FRAME_BYTES_MAX: u32 = RECORD_BYTES_MAX + 1024 * 1024;

/// Clients one store's server serves at once (`serve`): one thread each. A client beyond them
/// is refused with [`Error::LimitExceeded`](crate::Error::LimitExceeded).
pub const SERVE_CLIENTS_MAX: usize = 64;

/// Most messages one receive asks for through a store's socket, so that its answer fits in a
/// frame.
pub const SERVE_RECEIVE_MESSAGES_MAX: usize = 64;

/// Bytes of a socket path (the operating system's `sun_path` less its terminating zero: 108
/// bytes on Linux, 104 on the BSDs and macOS).
#[cfg(target_os = "linux")]
pub const SERVE_SOCKET_PATH_BYTES_MAX: usize = 107;

/// Bytes of a socket path (the operating system's `sun_path` less its terminating zero: 108
/// bytes on Linux, 104 on the BSDs and macOS).
#[cfg(not(target_os = "linux"))]
pub const SERVE_SOCKET_PATH_BYTES_MAX: usize = 103;

const _: () = assert!(RECORD_BYTES_MAX <= BATCH_BYTES_MAX - 4);
const _: () = assert!(RECORD_DECOMPRESSED_BYTES_MAX <= RECORD_BYTES_MAX);
const _: () = assert!(DICTIONARY_BYTES <= DICTIONARY_TRAINING_BYTES_MAX);
const _: () = assert!(DICTIONARY_FIRST_BYTES * 2 <= DICTIONARY_BYTES);
const _: () = assert!(DICTIONARY_FIRST_SAMPLES < DICTIONARY_TRAINING_SAMPLES);
const _: () = assert!(SEGMENT_BYTES_MIN <= SEGMENT_BYTES_DEFAULT);
const _: () = assert!(SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX);
// Offsets inside a segment and frame lengths are carried as u32 in places.
const _: () = assert!(SEGMENT_BYTES_MAX <= u32::MAX as u64);
const _: () = assert!(BATCH_RECORDS_MAX as u64 * 4 <= BATCH_BYTES_MAX as u64);
const _: () = assert!(COMMIT_GROUP_BYTES_MAX >= 64 * 1024);
// The atom table spans `ATOM_ID_MAX` entries in pages: its page list stays a few megabytes.
const _: () = assert!(ATOM_ID_MAX <= u32::MAX as u64);
const _: () = assert!(INDEX_SNAPSHOT_BYTES_MAX <= usize::MAX as u64);
// A checkpoint and the start record around it fit in one record.
/// Largest shipped manifest read back from object storage (`ship/`): ~100 bytes per listed
/// segment or snapshot, so a store of a million objects fits.
pub const SHIP_MANIFEST_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// Uploads or downloads of shipped objects in flight at once (`ship/`).
pub const SHIP_TRANSFERS_IN_FLIGHT: usize = 8;

/// Longest wait between two attempts of a failed shipping cycle (it doubles from the poll
/// interval up to this).
pub const SHIP_BACKOFF_MS_MAX: u64 = 30_000;

/// Default time between two shipping cycles (looking for newly sealed segments and snapshots).
pub const SHIP_POLL_MS_DEFAULT: u64 = 1_000;

/// Default time an object no manifest lists stays in the bucket before retention deletes it.
pub const SHIP_GRACE_MS_DEFAULT: u64 = 60 * 60 * 1000;

/// zstd level of shipped sealed segments: level 1 compresses the log's frames at hundreds of
/// MB/s on the shipping thread, and a restore decompresses them faster than a bucket serves
/// them (`docs/BENCHMARKS.md` §17).
pub const SHIP_SEGMENT_ZSTD_LEVEL: i32 = 1;

/// Attempts an S3 request is retried (after the first) inside one shipping cycle, within
/// [`SHIP_RETRY_TIMEOUT_MS`]: the cycle then fails and the shipping thread's own backoff
/// takes over, so that a bucket out of reach holds a close or a restore this long at most
/// per request.
pub const SHIP_REQUEST_RETRIES: usize = 3;

/// Longest time an S3 request's retries may take ([`SHIP_REQUEST_RETRIES`]).
pub const SHIP_RETRY_TIMEOUT_MS: u64 = 15_000;

const _: () = assert!(CHECKPOINT_BYTES_MAX * 2 <= RECORD_BYTES_MAX as usize);
const _: () = assert!(CHECKPOINT_NAME_BYTES_MAX * 4 <= CHECKPOINT_BYTES_MAX);
const _: () = assert!(CONTINUATION_BYTES_MAX < RECORD_DECOMPRESSED_BYTES_MAX as usize);
const _: () = assert!(CONTINUATION_TEXT_BYTES_MAX * 3 + CONTINUATION_NAME_BYTES_MAX * 4 < CONTINUATION_BYTES_MAX);
const _: () = assert!(CONTINUATION_DEPTH_MAX <= CONTINUATION_LEVELS_MAX);
// An atom's messages, with their start records and names, fit in half a batch, leaving the
// other half to the atom's own completion.
const _: () = assert!(
    CHANNEL_SENDS_PER_ATOM_MAX * (CHANNEL_MESSAGE_BYTES_MAX + 4 * CHANNEL_NAME_BYTES_MAX)
        <= BATCH_BYTES_MAX as usize / 2
);
const _: () = assert!(CHANNEL_MESSAGE_BYTES_MAX < RECORD_BYTES_MAX as usize);
// An atom's state writes, with their start records and key names, fit in a quarter of a batch.
const _: () = assert!(
    STATE_WRITES_PER_ATOM_MAX * (STATE_VALUE_BYTES_MAX + 4 * STATE_KEY_BYTES_MAX + 64) <= BATCH_BYTES_MAX as usize / 4
);
const _: () = assert!(STATE_KEYS_PER_ATOM_MAX <= STATE_WRITES_PER_ATOM_MAX);
// A lease atom's result (a fixed header and the holder) fits in any record.
const _: () = assert!(LEASE_HOLDER_BYTES_MAX + 64 < RECORD_BYTES_MAX as usize);
const _: () = assert!(LEASE_LOCKS.is_power_of_two());
// A remote receive's messages, with their ids and lengths, fit in one frame.
const _: () = assert!(SERVE_RECEIVE_MESSAGES_MAX * (CHANNEL_MESSAGE_BYTES_MAX + 64) <= SERVE_FRAME_BYTES_MAX as usize);
const _: () = assert!(SERVE_RECEIVE_MESSAGES_MAX <= CHANNEL_RECEIVE_MESSAGES_MAX);
const _: () = assert!(SERVE_FRAME_BYTES_MAX > RECORD_BYTES_MAX);
