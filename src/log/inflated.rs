//! A small process-wide cache of inflated compressed frames (`FORMAT.md` §5a), so that reading
//! records one by one from a compressed segment (an agent re-executing its completed atoms
//! after a restart, `Store::atom` over old history) inflates each frame once, not once per
//! record.
//!
//! Entries are keyed by the segment's salt (random store id and segment sequence), the frame's
//! offset and its header checksum, and are looked up only after the frame on disk has been
//! verified again: a frame rewritten at the same offset has another checksum, so a stale entry
//! is never returned. Bounded by bytes; the least recently used entries go first.

use bytes::Bytes;
use parking_lot::Mutex;

/// Bytes of inflated records the cache holds at most (a few default 512 KiB frames).
const CACHE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Which frame an entry holds: the segment's salt, the frame's offset, its header checksum.
pub(crate) type FrameKey = (u64, u64, u32);

static CACHE: Mutex<Vec<(FrameKey, Bytes)>> = Mutex::new(Vec::new());

/// The inflated records of the frame `key`, if cached (it becomes the most recently used).
pub(crate) fn get(key: FrameKey) -> Option<Bytes> {
    let mut cache = CACHE.lock();
    let at = cache.iter().position(|(k, _)| *k == key)?;
    let entry = cache.remove(at);
    let records = entry.1.clone();
    cache.push(entry);
    Some(records)
}

/// Caches the inflated records of the frame `key`, evicting the least recently used entries
/// beyond the byte bound (a frame larger than the bound is not cached).
pub(crate) fn put(key: FrameKey, records: Bytes) {
    if records.len() > CACHE_BYTES_MAX {
        return;
    }
    let mut cache = CACHE.lock();
    cache.retain(|(k, _)| *k != key);
    cache.push((key, records));
    let mut total: usize = cache.iter().map(|(_, r)| r.len()).sum();
    while total > CACHE_BYTES_MAX {
        total -= cache.remove(0).1.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_by_their_whole_key_and_bounded_by_bytes() {
        let frame = Bytes::from(vec![7u8; 1024 * 1024]);
        put((u64::MAX, 1, 2), frame.clone());
        assert_eq!(get((u64::MAX, 1, 2)).as_deref(), Some(&frame[..]));
        assert!(get((u64::MAX, 1, 3)).is_none(), "another checksum is another frame");
        assert!(get((u64::MAX - 1, 1, 2)).is_none(), "another segment is another frame");
        for offset in 10..20 {
            put((u64::MAX, offset, 0), frame.clone());
        }
        let held: usize = CACHE.lock().iter().map(|(_, r)| r.len()).sum();
        assert!(held <= CACHE_BYTES_MAX, "{held} bytes held");
        assert!(get((u64::MAX, 1, 2)).is_none(), "the oldest entry went first");
    }
}
