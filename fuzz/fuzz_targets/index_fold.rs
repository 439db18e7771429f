//! Fuzzes the whole index fold: the input is a sequence of store records (each a little-endian
//! `u16` length and its bytes), appended to a fresh log that the store then folds into its index.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::index_fold(data);
});
