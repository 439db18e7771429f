//! Where each shipped object lives in the bucket, under the store's prefix:
//!
//! ```text
//! <prefix>/manifest                                              the manifest (manifest.rs)
//! <prefix>/segments/<first_lsn:020>-g<generation>-e<epoch>-<sha:16>.seg.zst   a sealed segment
//! <prefix>/snapshots/<atom:020>-e<epoch>-<sha:16>.snap                        a snapshot file
//! <prefix>/tail/<first_lsn:020>-<next_lsn:020>-e<epoch>-<sha:16>.seg          the active segment's prefix
//! <prefix>/index/<covered:020>-e<epoch>-<sha:16>.idx                          an index snapshot
//! ```
//!
//! Every object but the manifest is written once (`PutMode::Create`) and never changed. Its key
//! names the owner's epoch and the first 16 hex digits of its content's SHA-256 (a segment's
//! before compression), so that two owners, or one owner's two versions of a segment, never
//! want the same key.

use object_store::path::Path;

/// The manifest's key.
pub(crate) fn manifest(prefix: &str) -> Path {
    join(prefix, "manifest")
}

/// A sealed segment's key (a zstd frame of the segment).
pub(crate) fn segment(prefix: &str, first_lsn: u64, generation: u32, epoch: u64, sha256: &[u8; 32]) -> Path {
    join(prefix, &format!("segments/{first_lsn:020}-g{generation}-e{epoch}-{}.seg.zst", short_hex(sha256)))
}

/// The key of an index snapshot covering the records below `covered`.
pub(crate) fn index(prefix: &str, covered: u64, epoch: u64, sha256: &[u8; 32]) -> Path {
    join(prefix, &format!("index/{covered:020}-e{epoch}-{}.idx", short_hex(sha256)))
}

/// A snapshot's key.
pub(crate) fn snapshot(prefix: &str, atom: u64, epoch: u64, sha256: &[u8; 32]) -> Path {
    join(prefix, &format!("snapshots/{atom:020}-e{epoch}-{}.snap", short_hex(sha256)))
}

/// The key of the active segment's prefix ending before `next_lsn`.
pub(crate) fn tail(prefix: &str, first_lsn: u64, next_lsn: u64, epoch: u64, sha256: &[u8; 32]) -> Path {
    join(prefix, &format!("tail/{first_lsn:020}-{next_lsn:020}-e{epoch}-{}.seg", short_hex(sha256)))
}

/// The folders of data objects (what bucket retention lists).
pub(crate) fn data_folders(prefix: &str) -> [Path; 4] {
    [join(prefix, "segments"), join(prefix, "snapshots"), join(prefix, "tail"), join(prefix, "index")]
}

fn join(prefix: &str, rest: &str) -> Path {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() { Path::from(rest) } else { Path::from(format!("{prefix}/{rest}")) }
}

fn short_hex(sha256: &[u8; 32]) -> String {
    sha256[..8].iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_version_and_the_owner() {
        let sha = [0xab; 32];
        assert_eq!(manifest("runs/a/").as_ref(), "runs/a/manifest");
        assert_eq!(manifest("").as_ref(), "manifest");
        assert_eq!(
            segment("p", 12, 2, 3, &sha).as_ref(),
            "p/segments/00000000000000000012-g2-e3-abababababababab.seg.zst"
        );
        assert_eq!(snapshot("p", 7, 1, &sha).as_ref(), "p/snapshots/00000000000000000007-e1-abababababababab.snap");
        assert_eq!(index("p", 9, 1, &sha).as_ref(), "p/index/00000000000000000009-e1-abababababababab.idx");
        assert_ne!(segment("p", 12, 2, 3, &sha), segment("p", 12, 2, 4, &sha));
    }
}
