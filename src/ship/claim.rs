//! Ownership: which epoch of a store's bucket prefix this directory owns.
//!
//! The owner's local claim, `ship.claim` in the store directory, names the store, the epoch it
//! took and the nonce it chose then; it is written (temp, `fdatasync`, rename, directory sync)
//! only after the conditional write that made the claim true succeeded:
//!
//! ```text
//! claim := magic "CONTCLAM" version:u32 reserved:u32 store_id:u64 epoch:u64 nonce:u64 crc:u32
//! ```
//!
//! At an open with shipping on, the claim and the bucket's manifest must agree (same epoch and
//! nonce), or the store is fenced: someone took it over since.

use std::path::Path;

use object_store::ObjectStore;

use crate::error::{Error, Result};
use crate::ship::manifest::{self, ShippedManifest, Versioned, Written};
use crate::storage::{OpenMode, Storage};
use crate::store::now_us;

/// The claim's file name in the store directory.
pub(crate) const CLAIM_FILE: &str = "ship.claim";
const CLAIM_TEMP: &str = "ship.claim.tmp";
const MAGIC: [u8; 8] = *b"CONTCLAM";
const VERSION: u32 = 1;
const BYTES: usize = 44;

/// What this directory owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub store_id: u64,
    pub epoch: u64,
    pub nonce: u64,
}

impl Claim {
    fn encode(&self) -> [u8; BYTES] {
        let mut bytes = [0u8; BYTES];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.store_id.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.nonce.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..40]);
        bytes[40..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let u64_at = |at: usize| bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        let crc = bytes.get(40..44).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)?;
        let version = bytes.get(8..12).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)?;
        if bytes.len() != BYTES || bytes[..8] != MAGIC || version != VERSION || crc32fast::hash(&bytes[..40]) != crc {
            return None;
        }
        Some(Claim { store_id: u64_at(16)?, epoch: u64_at(24)?, nonce: u64_at(32)? })
    }

    /// Whether `manifest` is this claim's (the bucket still names this owner).
    pub fn owns(&self, manifest: &ShippedManifest) -> bool {
        manifest.store_id == self.store_id && manifest.epoch == self.epoch && manifest.nonce == self.nonce
    }
}

/// The directory's claim, `None` if it has none.
///
/// # Errors
/// [`Error::Io`] reading it; [`Error::InvalidArgument`] for a damaged claim (the directory's
/// ownership is unknown: restore it anew).
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<Claim>> {
    let path = dir.join(CLAIM_FILE);
    let file = match storage.open(&path, OpenMode::ReadOnly) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("open", &path, e)),
    };
    let len = file.len().map_err(|e| Error::io("stat", &path, e))?;
    let mut bytes = vec![0u8; usize::try_from(len.min(BYTES as u64 + 1)).unwrap_or(BYTES)];
    file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io("read", &path, e))?;
    Claim::decode(&bytes)
        .map(Some)
        .ok_or_else(|| Error::InvalidArgument { reason: format!("{} is damaged", path.display()) })
}

/// Writes the directory's claim durably (temp, `fdatasync`, rename, directory sync).
///
/// # Errors
/// [`Error::Io`] from any step.
pub(crate) fn write(storage: &dyn Storage, dir: &Path, claim: Claim) -> Result<()> {
    let temp = dir.join(CLAIM_TEMP);
    let path = dir.join(CLAIM_FILE);
    let _ = storage.remove_file(&temp);
    let file = storage.open(&temp, OpenMode::CreateNew).map_err(|e| Error::io("create", &temp, e))?;
    file.write_all_at(&claim.encode(), 0).map_err(|e| Error::io("write", &temp, e))?;
    file.sync_data().map_err(|e| Error::io("fdatasync", &temp, e))?;
    storage.rename(&temp, &path).map_err(|e| Error::io("rename", &temp, e))?;
    storage.sync_dir(dir).map_err(|e| Error::io("sync directory", dir, e))
}

/// A manifest this process may write: its claim and the object's version.
pub(crate) struct Owned {
    pub claim: Claim,
    pub current: Versioned,
}

/// At an open with shipping on: proves that `dir` (store `store_id`, local claim `claim`) owns
/// the bucket's prefix, creating the manifest (epoch 1) for a store shipped for the first time.
///
/// # Errors
/// [`Error::Fenced`] when the manifest names another owner (a takeover happened, or the
/// directory has no claim on a prefix that has a manifest); [`Error::InvalidArgument`] when the
/// prefix holds another store's manifest; [`Error::ObjectStore`] when the bucket fails.
pub(crate) async fn prove(
    remote: &dyn ObjectStore,
    prefix: &str,
    owner: &str,
    store_id: u64,
    claim: Option<Claim>,
) -> Result<Owned> {
    loop {
        match (manifest::fetch(remote, prefix).await?, claim) {
            (Some(current), _) if current.manifest.store_id != store_id => {
                return Err(Error::InvalidArgument {
                    reason: format!(
                        "the bucket prefix {prefix:?} holds store {:#x}'s manifest, not this store's ({store_id:#x})",
                        current.manifest.store_id
                    ),
                });
            }
            (Some(current), Some(claim)) if claim.owns(&current.manifest) => {
                return Ok(Owned { claim, current });
            }
            (Some(current), claim) => {
                return Err(Error::Fenced { epoch: claim.map_or(0, |c| c.epoch), current: current.manifest.epoch });
            }
            (None, claim) => {
                // A first shipping (or a prefix emptied under an owner: it goes on at its epoch).
                let claim = claim.unwrap_or(Claim { store_id, epoch: 1, nonce: nonce() });
                let manifest = ShippedManifest {
                    store_id,
                    epoch: claim.epoch,
                    owner: owner.to_owned(),
                    nonce: claim.nonce,
                    written_at_unix_us: now_us(),
                    ..ShippedManifest::default()
                };
                if let Written::Done(version) = manifest::write(remote, prefix, &manifest, None).await? {
                    return Ok(Owned { claim, current: Versioned { manifest, version } });
                }
                // Another process created it first: look again.
            }
        }
    }
}

/// Attempts of a takeover whose conditional write the previous owner's own writes refused.
const TAKEOVER_ATTEMPTS: usize = 16;

/// Takes the store under `prefix` over for `owner`: the manifest's epoch + 1, by a conditional
/// write on the version read; only from epoch `from` when given. Exactly one of several
/// takers racing from the same epoch wins. A write refused because the manifest changed
/// within the epoch read (the previous owner still shipping, or a write of a dead owner's that
/// was in flight when it died and landed since) is tried again on the manifest as it is now;
/// only a manifest of another epoch means another taker won.
///
/// # Errors
/// [`Error::Fenced`] when another taker won, or the bucket's epoch is not `from`;
/// [`Error::ObjectStore`] when the bucket fails or has no manifest under `prefix`.
pub(crate) async fn take_over(remote: &dyn ObjectStore, prefix: &str, owner: &str, from: Option<u64>) -> Result<Owned> {
    let mut from = from;
    let mut refused_at = 0;
    for _ in 0..TAKEOVER_ATTEMPTS {
        let Some(read) = manifest::fetch(remote, prefix).await? else {
            return Err(Error::ObjectStore {
                op: "get",
                key: crate::ship::layout::manifest(prefix).to_string(),
                message: "there is no shipped store under this prefix".into(),
            });
        };
        if let Some(from) = from
            && from != read.manifest.epoch
        {
            return Err(Error::Fenced { epoch: from + 1, current: read.manifest.epoch });
        }
        let claim = Claim { store_id: read.manifest.store_id, epoch: read.manifest.epoch + 1, nonce: nonce() };
        let manifest = ShippedManifest {
            epoch: claim.epoch,
            owner: owner.to_owned(),
            nonce: claim.nonce,
            written_at_unix_us: now_us(),
            ..read.manifest.clone()
        };
        match manifest::write(remote, prefix, &manifest, Some(&read.version)).await? {
            Written::Done(version) => return Ok(Owned { claim, current: Versioned { manifest, version } }),
            // IMPORTANT: the next attempt takes over only from the epoch read: if another taker
            // won meanwhile, the epoch changed and this one is fenced.
            Written::Refused => {
                from = Some(read.manifest.epoch);
                refused_at = read.manifest.epoch;
                tracing::info!(epoch = refused_at, "a takeover's manifest write was refused; reading it again");
            }
        }
    }
    Err(Error::Fenced { epoch: refused_at + 1, current: 0 })
}

/// A random number (the claim's nonce).
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_round_trips_and_damage_is_refused() {
        let claim = Claim { store_id: 1, epoch: 2, nonce: 3 };
        let bytes = claim.encode();
        assert_eq!(Claim::decode(&bytes), Some(claim));
        for at in 0..BYTES {
            let mut damaged = bytes;
            damaged[at] ^= 1;
            assert_eq!(Claim::decode(&damaged), None, "flip at {at} accepted");
        }
        assert_eq!(Claim::decode(&bytes[..BYTES - 1]), None);
    }
}
