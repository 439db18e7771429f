//! Fuzzes replay's zero-copy readers (delta ops, start records, snapshot contexts) against
//! prost: the first byte picks the reader, the rest is its input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::replay_decode(data);
});
