//! Fuzzes the index checkpoint's decoder: the input is a checkpoint body, under a header made
//! for it (so that the checksums match and the decoder is reached).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::index_checkpoint(data);
});
