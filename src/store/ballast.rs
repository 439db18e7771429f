//! The ballast: space set aside in the store's directory (a file named `ballast`, opt-in with
//! [`StoreBuilder::ballast_bytes`](crate::StoreBuilder::ballast_bytes)) and given back when a
//! compaction round runs out of space, so that the round can rewrite segments on a disk that
//! has not a byte left ("A full disk" in docs/ARCHITECTURE.md). Only its length matters: it is
//! never read, recovery ignores it, and losing it in a crash only means it is made again at
//! the next open.

use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage};

/// The ballast's file name in a store directory.
pub(crate) const FILE_NAME: &str = "ballast";

/// Makes the ballast at least `bytes` long, its blocks reserved (creating it, or growing a
/// shorter one). Returns whether it is in place: a disk without the room is not an error.
pub(crate) fn ensure(storage: &dyn Storage, dir: &Path, bytes: u64) -> Result<bool> {
    let path = dir.join(FILE_NAME);
    let file = match storage.open(&path, OpenMode::ReadWrite) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            storage.open(&path, OpenMode::CreateNew).map_err(|e| Error::io("create", &path, e))?
        }
        Err(error) => return Err(Error::io("open", &path, error)),
    };
    if file.len().map_err(|e| Error::io("stat", &path, e))? >= bytes {
        return Ok(true);
    }
    match file.allocate(bytes) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::StorageFull => Ok(false),
        Err(error) => Err(Error::io("preallocate", &path, error)),
    }
}

/// Removes the ballast, giving its space back; returns whether there was one.
pub(crate) fn release(storage: &dyn Storage, dir: &Path) -> Result<bool> {
    let path = dir.join(FILE_NAME);
    match storage.remove_file(&path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(Error::io("remove", &path, error)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{FILE_NAME, ensure, release};
    use crate::storage::Storage;
    use crate::storage::sim::SimStorage;

    #[test]
    fn the_ballast_takes_its_room_when_there_is_some_and_gives_it_back() {
        let sim = SimStorage::new(1);
        let dir = Path::new("/store");
        sim.create_dir_all(dir).expect("dir");
        sim.set_capacity(Some(10_000));
        assert!(!ensure(&sim, dir, 20_000).expect("ensure"), "no room for it");
        assert!(ensure(&sim, dir, 8_000).expect("ensure"));
        assert_eq!(sim.used_bytes(), 8_000);
        assert!(ensure(&sim, dir, 8_000).expect("ensure"), "in place already");
        assert!(release(&sim, dir).expect("release"));
        assert_eq!(sim.used_bytes(), 0);
        assert!(!release(&sim, dir).expect("release"), "given back already");
        assert!(sim.file_names(dir).iter().all(|name| name != FILE_NAME));
    }
}
