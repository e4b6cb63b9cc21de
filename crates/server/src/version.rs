//! What this build is, and what it stays compatible with: one release
//! number and one number per thing that must keep working across releases.
//!
//! Why explicit numbers next to the release: semver says whether an upgrade
//! may break something; these say what. An operator (and, later, the
//! cluster version) compares them member by member: two releases with the
//! same data format open each other's directories, the same backup format
//! each other's backups, the same peer protocol run in one cluster, and the
//! same client API serve each other's clients. `docs/upgrading.md` writes
//! down the rules; `CHANGELOG.md` says which release changed which number.
//!
//! Every number is read from where it is enforced (the store's format
//! marker, the backup header, the proto crate), so it cannot drift from it;
//! the release itself is the crate root's [`RELEASE`], below the store and
//! the backups that name it in their errors. Metrics takes these numbers
//! as data (`Metrics::new`), so this module can read from the layers above
//! it without a circle.

use deadbolt_core::FeatureLevel;
use deadbolt_proto::v1::BuildVersions;

pub use crate::RELEASE;

/// The encoding of what nodes send each other: openraft's messages with
/// Deadbolt's log entries (`Batch` of `Command`s) and snapshots (the
/// `LockTable`), bincode-encoded. Bump when a node of the previous value
/// could not decode what this build sends.
pub const PEER_PROTOCOL: u32 = 1;

/// This build's numbers; its feature level is the newest it supports (a
/// node started with `--max-feature-level` reports less in its status).
pub fn build_versions() -> BuildVersions {
    BuildVersions {
        release: RELEASE.to_owned(),
        data_format: crate::store::DATA_FORMAT,
        backup_format: crate::backup::VERSION,
        peer_protocol: PEER_PROTOCOL,
        client_api: deadbolt_proto::CLIENT_API,
        feature_level: FeatureLevel::NEWEST.0,
    }
}

/// One line for people: `0.2.0-dev (data format 12, backup format 3, peer
/// protocol 1, client API 1, feature level 2)`.
pub fn describe(versions: &BuildVersions) -> String {
    format!(
        "{} (data format {}, backup format {}, peer protocol {}, client API {}, feature level {})",
        versions.release,
        versions.data_format,
        versions.backup_format,
        versions.peer_protocol,
        versions.client_api,
        FeatureLevel::reported(versions.feature_level)
    )
}
