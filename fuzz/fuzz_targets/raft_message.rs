//! A peer's message: the same bytes as an append, a snapshot chunk and a
//! vote request, as the three Raft calls read them.
#![no_main]

use deadbolt_server::untrusted;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    untrusted::raft_append(bytes);
    untrusted::raft_snapshot_chunk(bytes);
    untrusted::raft_vote(bytes);
});
