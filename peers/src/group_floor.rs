//! Ceilings for workload 2, measured with no engine at all: how many durable appends per
//! second `writers` threads can reach on this machine when each waits for the `fdatasync`
//! that covers its own append. They say how close to the disk and the CPUs an engine's group
//! commit comes, and what ratio to SQLite any engine could reach here.
//!
//! Both write into a file first filled with written zeros and synced, so that no `fdatasync`
//! has an unwritten extent to convert (a journal commit on ext4): the best case for any
//! engine, as an engine that zeroes ahead (continuum) or reuses its log file (SQLite's WAL)
//! gets.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes of one append in both ceilings (the raw `fdatasync` floor's write size).
pub const APPEND_BYTES: usize = 512;

/// A file of `appends` × [`APPEND_BYTES`] bytes of written zeros, synced, at `path`.
fn zeroed_file(path: &Path, appends: u64) -> std::io::Result<File> {
    let file = File::options().read(true).write(true).create(true).truncate(true).open(path)?;
    let chunk = vec![0_u8; 1 << 20];
    let total = appends * APPEND_BYTES as u64;
    let mut offset = 0;
    while offset < total {
        let len = (total - offset).min(chunk.len() as u64);
        file.write_all_at(&chunk[..usize::try_from(len).expect("at most one chunk")], offset)?;
        offset += len;
    }
    file.sync_all()?;
    Ok(file)
}

/// Writes in the ceiling's file, removed when dropped.
struct FloorFile {
    file: File,
    path: std::path::PathBuf,
}

impl FloorFile {
    fn new(dir: &Path, name: &str, appends: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(name);
        Ok(Self { file: zeroed_file(&path, appends)?, path })
    }
}

impl Drop for FloorFile {
    fn drop(&mut self) {
        // Best effort: the bench's temporary root is removed at the end of the run anyway.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The disk's ceiling: one thread writes `writers` appends at a time in one `pwrite` and
/// `fdatasync`s them, `rounds` times; returns appends per second (`writers` per sync, and no
/// thread ever waits to be woken).
///
/// # Errors
/// The file cannot be created, written or synced.
pub fn one_thread_groups(dir: &Path, writers: u32, rounds: u64) -> std::io::Result<f64> {
    let floor = FloorFile::new(dir, "one-thread-groups", rounds * u64::from(writers))?;
    let group = vec![0xA5_u8; APPEND_BYTES * writers as usize];
    let start = Instant::now();
    for round in 0..rounds {
        floor.file.write_all_at(&group, round * group.len() as u64)?;
        floor.file.sync_data()?;
    }
    Ok(rate(rounds * u64::from(writers), start.elapsed()))
}

/// The ceiling of group commit with `writers` threads that each wait for their own append:
/// in each of `rounds` rounds every thread copies its append into a shared buffer; the last to
/// arrive writes the buffer in one `pwrite`, `fdatasync`s it and tells the others, who yield
/// the CPU in a loop until then (no sleeping, no wake-up call). Nothing else is done: no
/// encoding, no checksum, no queue, no index. Returns appends per second, timed from the
/// moment every thread is ready.
///
/// # Errors
/// The file cannot be created, written or synced (the first error any thread met).
pub fn ideal_group_commit(dir: &Path, writers: u32, rounds: u64) -> std::io::Result<f64> {
    let floor = FloorFile::new(dir, "ideal-group-commit", rounds * u64::from(writers))?;
    Ok(rate(rounds * u64::from(writers), rounds_of_group_commit(&floor.file, writers, rounds)?))
}

/// [`ideal_group_commit`] in `file`; returns the wall time.
fn rounds_of_group_commit(file: &File, writers: u32, rounds: u64) -> std::io::Result<Duration> {
    let writers_n = writers as usize;
    // (appends copied in this round, the round's buffer, the first error)
    let round = Mutex::new((0_usize, Vec::with_capacity(APPEND_BYTES * writers_n), None::<std::io::Error>));
    let synced_rounds = AtomicU64::new(0);
    let ready = Barrier::new(writers_n + 1);
    let elapsed = std::thread::scope(|scope| {
        let (round, synced_rounds, ready) = (&round, &synced_rounds, &ready);
        let threads: Vec<_> = (0..writers)
            .map(|writer| {
                scope.spawn(move || {
                    let append = [u8::try_from(writer % 250 + 1).expect("at most 250"); APPEND_BYTES];
                    ready.wait();
                    for number in 0..rounds {
                        let mut state = round.lock().unwrap_or_else(PoisonError::into_inner);
                        state.0 += 1;
                        state.1.extend_from_slice(&append);
                        if state.0 == writers_n {
                            let offset = number * (APPEND_BYTES * writers_n) as u64;
                            let written = file.write_all_at(&state.1, offset).and_then(|()| file.sync_data());
                            if let Err(error) = written {
                                state.2.get_or_insert(error);
                            }
                            state.0 = 0;
                            state.1.clear();
                            synced_rounds.store(number + 1, Ordering::Release);
                        } else {
                            drop(state);
                            while synced_rounds.load(Ordering::Acquire) <= number {
                                std::thread::yield_now();
                            }
                        }
                    }
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        for thread in threads {
            thread.join().expect("a floor writer does not panic");
        }
        start.elapsed()
    });
    let (_, _, error) = round.into_inner().unwrap_or_else(PoisonError::into_inner);
    match error {
        Some(error) => Err(error),
        None => Ok(elapsed),
    }
}

fn rate(appends: u64, elapsed: Duration) -> f64 {
    appends as f64 / elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ideal_group_commit_writes_every_append_of_every_round() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (writers, rounds) = (4, 50);
        let file = zeroed_file(&dir.path().join("f"), rounds * u64::from(writers)).expect("a zeroed file");
        rounds_of_group_commit(&file, writers, rounds).expect("the rounds run");
        let written = std::fs::read(dir.path().join("f")).expect("readable");
        for (at, round) in written.chunks(APPEND_BYTES * writers as usize).enumerate() {
            let mut firsts: Vec<u8> = round.chunks(APPEND_BYTES).map(|append| append[0]).collect();
            firsts.sort_unstable();
            assert_eq!(firsts, [1, 2, 3, 4], "round {at} holds one append of each writer");
        }
        assert_eq!(written.len(), APPEND_BYTES * 4 * 50);
    }

    #[test]
    fn the_ideal_group_commit_removes_its_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert!(ideal_group_commit(dir.path(), 4, 3).expect("the ceiling runs") > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).expect("listable").count(), 0);
    }

    #[test]
    fn one_thread_groups_measures_a_rate() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert!(one_thread_groups(dir.path(), 16, 3).expect("the ceiling runs") > 0.0);
    }
}
