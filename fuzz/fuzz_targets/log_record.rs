//! A log record's payload, past its checksum.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    deadbolt_server::untrusted::log_record(bytes);
});
