//! Fuzzes frame decoding: the first 8 bytes are the segment salt, the rest a candidate frame.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::decode_batch(data);
});
