//! Fuzzes store record decoding: the input is one log record's bytes (envelope + body).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::decode_record(data);
});
