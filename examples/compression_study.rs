//! Measures how to compress the store's records: per record, per batch, or per record with a
//! dictionary trained on the store's own records. Prints bytes per 500-byte-ish delta for each
//! choice; `docs/FORMAT.md` records the figures and the choice made.
//!
//! `cargo run --release --example compression_study`

use std::time::Instant;

use continuum::synthetic::Transcript;
use prost::Message;

const TRAIN: usize = 2_000;
const EVAL: usize = 10_000;

fn main() {
    let mut training = Transcript::new(1);
    let samples: Vec<Vec<u8>> = (0..TRAIN).map(|_| training.next_delta(500).encode_to_vec()).collect();
    let mut evaluation = Transcript::new(2);
    let records: Vec<Vec<u8>> = (0..EVAL).map(|_| evaluation.next_delta(500).encode_to_vec()).collect();
    let raw: usize = records.iter().map(Vec::len).sum();
    println!("{EVAL} deltas, protobuf-encoded: {:.1} bytes each on average", raw as f64 / EVAL as f64);
    for level in [1, 3, 9] {
        report(&format!("per record, zstd level {level}"), &records, |r| zstd::bulk::compress(r, level).expect("zstd"));
    }
    for batch in [4usize, 16, 64] {
        let started = Instant::now();
        let total: usize =
            records.chunks(batch).map(|chunk| zstd::bulk::compress(&chunk.concat(), 3).expect("zstd").len()).sum();
        print_line(&format!("per batch of {batch}, zstd level 3"), total, started);
    }
    // The store's first dictionary: trained on its first `DICTIONARY_FIRST_SAMPLES` deltas.
    {
        let first = &samples[..continuum::limits::DICTIONARY_FIRST_SAMPLES];
        let started = Instant::now();
        let dictionary = zstd::dict::from_samples(first, continuum::limits::DICTIONARY_FIRST_BYTES).expect("train");
        let trained_in = started.elapsed();
        let mut compressor = zstd::bulk::Compressor::with_dictionary(3, &dictionary).expect("compressor");
        report(
            &format!(
                "per record, first {} KiB dictionary from {} samples (trained in {trained_in:.0?}), level 3",
                continuum::limits::DICTIONARY_FIRST_BYTES / 1024,
                first.len()
            ),
            &records,
            |r| compressor.compress(r).expect("zstd"),
        );
    }
    for dict_bytes in [8 * 1024, 16 * 1024, 32 * 1024, 64 * 1024] {
        let started = Instant::now();
        let dictionary = zstd::dict::from_samples(&samples, dict_bytes).expect("train");
        let trained_in = started.elapsed();
        let mut compressor = zstd::bulk::Compressor::with_dictionary(3, &dictionary).expect("compressor");
        report(
            &format!("per record, {} KiB dictionary (trained in {trained_in:.0?}), level 3", dict_bytes / 1024),
            &records,
            |r| compressor.compress(r).expect("zstd"),
        );
    }
}

fn report(label: &str, records: &[Vec<u8>], mut compress: impl FnMut(&[u8]) -> Vec<u8>) {
    let started = Instant::now();
    let total: usize = records.iter().map(|r| compress(r).len()).sum();
    print_line(label, total, started);
}

fn print_line(label: &str, total: usize, started: Instant) {
    let per = started.elapsed().as_secs_f64() * 1e6 / EVAL as f64;
    println!("{label:<60} {:>7.1} bytes/delta  {per:>6.2} µs/delta", total as f64 / EVAL as f64);
}
