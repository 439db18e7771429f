//! Fuzzes the index snapshot's decoder: the input is an index snapshot body, under a header made
//! for it (so that the checksums match and the decoder is reached).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::index_snapshot(data);
});
