//! Fuzzes continuation events: the input is the result of a continuation control atom.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    continuum::fuzz::continuation_event(data);
});
