//! How small can an atom be as it is appended? Workload 6's goal asks for at most 0.30× the
//! bytes per atom of every peer right after each workload, including workload 1, where one
//! writer waits for every atom's `fdatasync`. This study compresses the suite's own deltas
//! (the same generator and seed) the ways an append path could, and sets each figure against
//! the goal's ceiling and against what its CPU would add to workload 1's latency.
//!
//! `cargo run --release -p continuum-peers --example space_floor [dir]`
//!
//! `dir` (default: the current directory) is where the `fdatasync` probe writes its
//! preallocated file; give it a directory on the disk the suite runs on.
//!
//! The ceiling: 0.30 × what a peer stores per atom. No peer can store less than the atom's
//! agent, id and delta (12 + the delta's bytes), so 0.30 × that is a floor under the ceiling;
//! the smallest peer measured (okaywal, `docs/BENCHMARKS.md` §8, W6) stores about 536–542
//! bytes per atom, 12–19 more. An atom appended by continuum needs, besides its compressed
//! delta, the same 12 bytes of identity and a frame to find and check it; this study charges
//! it nothing for either, so every figure here is below what an engine would store.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use continuum_peers::{Deltas, FdatasyncProbe, HEADER_BYTES};

/// Deltas the dictionaries are trained on (the store trains its final one on 2,000).
const TRAIN: usize = 20_000;
/// Deltas compressed for each figure, after the training ones.
const EVAL: usize = 20_000;
/// `fdatasync` calls timed for workload 1's baseline.
const SYNCS: usize = 2_000;
/// Workload 6's goal: at most this share of a peer's bytes per atom.
const GOAL: f64 = 0.30;
/// Workload 1's goal: a durable append within this factor of the raw `fdatasync`.
const W1_GOAL: f64 = 1.15;
/// Bytes of identity each atom carries besides its delta: the header the log-style peers
/// store (agent `u32`, atom id `u64`).
const IDENTITY_BYTES: f64 = HEADER_BYTES as f64;
/// The smallest peer's bytes per atom in the suite's runs (okaywal, data set as loaded).
const SMALLEST_PEER_BYTES: f64 = 535.9;

fn main() {
    let dir = std::env::args().nth(1).map_or_else(|| PathBuf::from("."), PathBuf::from);
    let mut deltas = Deltas::new(42);
    let train: Vec<Vec<u8>> = (0..TRAIN).map(|_| deltas.next_encoded().bytes).collect();
    let eval: Vec<Vec<u8>> = (0..EVAL).map(|_| deltas.next_encoded().bytes).collect();
    let plain = eval.iter().map(Vec::len).sum::<usize>() as f64 / EVAL as f64;
    let floor_ceiling = GOAL * (IDENTITY_BYTES + plain);
    let measured_ceiling = GOAL * SMALLEST_PEER_BYTES;
    let sync = sync_p50(&dir);
    println!("{EVAL} deltas of the suite's stream (seed 42, after {TRAIN} for training): {plain:.1} bytes each");
    println!(
        "workload 6 ceiling per atom: {floor_ceiling:.1} bytes if a peer stored nothing but the atom \
         ({GOAL:.2} x (12 + delta)); {measured_ceiling:.1} against okaywal's {SMALLEST_PEER_BYTES} as measured"
    );
    println!("fdatasync p50 here (512-byte writes to a preallocated file): {:.1} us", micros(sync));
    println!();
    println!(
        "| compression | delta bytes | + identity | / ceiling (floor) | room left for a frame | CPU per delta | workload 1 bound |"
    );
    println!("|---|---|---|---|---|---|---|");

    let store_dictionary = zstd::dict::from_samples(&train[..2_000], 64 << 10).unwrap();
    let best_dictionary = zstd::dict::from_samples(&train, 112 << 10).unwrap();
    let row = |label: &str, bytes: f64, cpu: Duration| {
        let atom = bytes + IDENTITY_BYTES;
        let cpu_us = micros(cpu);
        println!(
            "| {label} | {bytes:.1} | {atom:.1} | {:.2}x | {:.1} | {cpu_us:.2} us | {:.3}x (goal <= {W1_GOAL}) |",
            atom / floor_ceiling,
            measured_ceiling - atom,
            (micros(sync) + cpu_us) / micros(sync),
        );
    };
    for level in [1, 3, 9] {
        let (bytes, cpu) = per_record(&eval, level, &[]);
        row(&format!("per delta, zstd {level}, no dictionary"), bytes, cpu);
    }
    for level in [3, 9, 19] {
        let (bytes, cpu) = per_record(&eval, level, &store_dictionary);
        row(&format!("per delta, zstd {level}, the store's dictionary (64 KiB, 2,000 deltas)"), bytes, cpu);
    }
    for level in [3, 9, 19] {
        let (bytes, cpu) = per_record(&eval, level, &best_dictionary);
        row(&format!("per delta, zstd {level}, 112 KiB dictionary on {TRAIN} deltas"), bytes, cpu);
    }
    for group in [2usize, 4, 16] {
        let (bytes, cpu) = per_group(&eval, group, &best_dictionary);
        row(
            &format!("per group of {group} deltas, zstd 3, 112 KiB dictionary (not possible with one writer)"),
            bytes,
            cpu,
        );
    }
}

/// Mean compressed bytes and CPU per delta, each compressed alone.
fn per_record(eval: &[Vec<u8>], level: i32, dictionary: &[u8]) -> (f64, Duration) {
    let mut compressor = compressor(level, dictionary);
    let started = Instant::now();
    let total: usize = eval.iter().map(|delta| compressor.compress(delta).unwrap().len()).sum();
    (total as f64 / eval.len() as f64, started.elapsed() / eval.len() as u32)
}

/// Mean compressed bytes and CPU per delta, `group` consecutive deltas compressed together.
fn per_group(eval: &[Vec<u8>], group: usize, dictionary: &[u8]) -> (f64, Duration) {
    let mut compressor = compressor(3, dictionary);
    let started = Instant::now();
    let total: usize = eval.chunks(group).map(|chunk| compressor.compress(&chunk.concat()).unwrap().len()).sum();
    (total as f64 / eval.len() as f64, started.elapsed() / eval.len() as u32)
}

/// A compressor writing bare frames: no checksum, content size or dictionary id (an engine
/// keeps those in its own framing, and this study charges nothing for framing).
fn compressor(level: i32, dictionary: &[u8]) -> zstd::bulk::Compressor<'static> {
    let mut compressor = zstd::bulk::Compressor::with_dictionary(level, dictionary).unwrap();
    compressor.include_checksum(false).unwrap();
    compressor.include_contentsize(false).unwrap();
    compressor.include_dictid(false).unwrap();
    compressor
}

/// The median of `SYNCS` 512-byte writes each followed by `fdatasync`, in `dir`.
fn sync_p50(dir: &std::path::Path) -> Duration {
    let root = tempfile::Builder::new().prefix("space-floor-").tempdir_in(dir).unwrap();
    let mut probe = FdatasyncProbe::new(root.path()).unwrap();
    let mut times: Vec<Duration> = (0..SYNCS).map(|_| probe.write_and_sync().unwrap()).collect();
    times.sort_unstable();
    times[SYNCS / 2]
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
