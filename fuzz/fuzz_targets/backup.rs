//! A backup file, as `deadbolt snapshot restore` reads it.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    deadbolt_server::untrusted::backup(bytes);
});
