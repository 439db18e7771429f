//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same entry points the
//! cargo-fuzz targets call, so that CI on the stable toolchain catches a regression on any input
//! the fuzzers once found interesting. Guards invariant 9: malformed input never panics.

use std::fs;
use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut count = 0;
    let mut entries: Vec<_> = fs::read_dir(&dir).expect("the corpus directory exists").collect();
    entries.sort_by_key(|entry| entry.as_ref().map(|e| e.path()).ok());
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_file() {
            run(&fs::read(&path).expect("corpus file"));
            count += 1;
        }
    }
    count
}

#[test]
fn decode_batch_corpus_never_panics() {
    let count = replay("decode_batch", continuum::fuzz::decode_batch);
    assert!(count > 0, "the decode_batch corpus must not be empty");
    eprintln!("decode_batch: {count} inputs");
}

#[test]
fn recover_segment_corpus_never_panics() {
    let count = replay("recover_segment", continuum::fuzz::recover_segment);
    assert!(count > 0, "the recover_segment corpus must not be empty");
    eprintln!("recover_segment: {count} inputs");
}

#[test]
fn decode_record_corpus_never_panics() {
    let count = replay("decode_record", continuum::fuzz::decode_record);
    assert!(count > 0, "the decode_record corpus must not be empty");
    eprintln!("decode_record: {count} inputs");
}

#[test]
fn replay_decode_corpus_agrees_with_prost() {
    let count = replay("replay_decode", continuum::fuzz::replay_decode);
    assert!(count > 0, "the replay_decode corpus must not be empty");
    eprintln!("replay_decode: {count} inputs");
}

#[test]
fn index_snapshot_corpus_never_panics() {
    let count = replay("index_snapshot", continuum::fuzz::index_snapshot);
    assert!(count > 0, "the index_snapshot corpus must not be empty");
    eprintln!("index_snapshot: {count} inputs");
}

#[test]
fn index_fold_corpus_folds_alike_on_one_thread_and_pipelined() {
    let count = replay("index_fold", continuum::fuzz::index_fold);
    assert!(count >= 3, "the index_fold corpus must hold its seeds");
    eprintln!("index_fold: {count} inputs");
}

#[test]
fn continuation_event_corpus_never_panics() {
    let count = replay("continuation_event", continuum::fuzz::continuation_event);
    assert!(count >= 3, "the continuation_event corpus must hold its seeds");
    eprintln!("continuation_event: {count} inputs");
}

/// Writes the hand-made seeds. Run with `cargo test --test fuzz_corpus -- --ignored` after a
/// format change, then commit `fuzz/corpus/`.
#[test]
#[ignore = "regenerates checked-in files"]
fn write_seed_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, name, bytes) in continuum::fuzz::seeds() {
        let dir = root.join(target);
        fs::create_dir_all(&dir).expect("corpus directory");
        fs::write(dir.join(name), bytes).expect("seed file");
    }
}
