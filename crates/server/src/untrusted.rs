//! Every decoder of the server's own formats (bincode) for bytes that come
//! from outside the process, by what they decode, each answering whether
//! the bytes decoded. (Clients' protobuf and JSON are decoded by prost and
//! serde behind the frame and body limits; the framed `Calls` codec has a
//! fuzz target of its own, `calls_frames`.)
//!
//! Why a list of its own: these are the doors a crafted file or message
//! comes in by (issue 58, part 1), and two kinds of test walk through each
//! of them. The unit tests (`huge_lengths.rs`, run in CI) make every
//! length in valid bytes huge and bound the allocation; the `cargo fuzz`
//! targets in `fuzz/` (for longer runs, by hand) feed them whatever
//! libFuzzer makes up. Both call these functions, so a decoder added to the
//! server without a line here is visibly missing from both.
//!
//! Each must answer `false` or `true` for any input: never panic, never
//! allocate more than the input could describe.

use crate::raft_types::TypeConfig;
use crate::NodeId;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

/// A snapshot's table image: from the data directory, or a leader's
/// snapshot once its chunks are put together.
pub fn table_image(bytes: &[u8]) -> bool {
    crate::store::table_image::decode(bytes).is_ok()
}

/// A backup file, as `deadbolt snapshot restore` and `snapshot inspect`
/// read it (its checksum is no secret: anyone can seal what they like).
pub fn backup(bytes: &[u8]) -> bool {
    crate::Backup::decode(bytes).is_ok()
}

/// A log record's payload, past its checksum (which anyone who can write
/// the file can compute).
pub fn log_record(payload: &[u8]) -> bool {
    crate::store::decode_entries(payload).is_ok()
}

/// A peer's append, as `append_entries` reads it.
pub fn raft_append(bytes: &[u8]) -> bool {
    crate::network::decode_message::<AppendEntriesRequest<TypeConfig>>(bytes).is_ok()
}

/// A leader's snapshot chunk, as `install_snapshot` reads it.
pub fn raft_snapshot_chunk(bytes: &[u8]) -> bool {
    crate::network::decode_message::<InstallSnapshotRequest<TypeConfig>>(bytes).is_ok()
}

/// A candidate's vote request, as `vote` reads it.
pub fn raft_vote(bytes: &[u8]) -> bool {
    crate::network::decode_message::<VoteRequest<NodeId>>(bytes).is_ok()
}
