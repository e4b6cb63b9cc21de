//! A snapshot's table image, from a data directory or a leader's chunks.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    deadbolt_server::untrusted::table_image(bytes);
});
