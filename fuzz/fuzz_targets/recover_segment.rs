//! Fuzzes recovery: the input is the whole content of a store's only segment file.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::recover_segment(data);
});
