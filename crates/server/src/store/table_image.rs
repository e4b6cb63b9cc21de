//! A lock table as bytes, for snapshots (and, inside backups, for
//! `backup.rs`): release 0.1.0's encoding (the table's bincode) while the
//! cluster version is [`FeatureLevel::BASE`], and the same behind a header
//! naming the level once it is above. From [`FeatureLevel::SEMAPHORES`] on,
//! the header is followed by the table's length, the table, and the
//! semaphores (which the table's own encoding leaves out); from
//! [`FeatureLevel::CREDENTIAL_ENDS`] on, by the semaphores' length, the
//! semaphores, and the token expiries and deny list (which the access
//! rules' own encoding leaves out).
//!
//! Why the header only then: a leader sends its snapshot to followers that
//! may still run the previous release, so until every member supports a
//! newer level the snapshot must be byte for byte what that release writes.
//! Once the level has moved, the header makes release 0.1.0 refuse the
//! snapshot with a decoding error, rather than drop the level and read on,
//! and it tells this build the level.

use deadbolt_core::{FeatureLevel, LockTable};

/// The start of a table image with a header. Release 0.1.0 reads it as a
/// table of one session whose `owner` option has the tag 0xFF, and stops
/// with "invalid tag" (the bytes before it are a session id and a TTL no
/// table holds, and a secret hash). A marker read as a larger session count
/// would not do: that release's map decoder allocates the count up front.
/// No table in release 0.1.0's encoding starts with these bytes: its option
/// tags are 0 or 1.
const MARKER: [u8; 57] = {
    let mut marker = [0xFF; 57];
    let one_session = 1u64.to_le_bytes();
    let mut at = 0;
    while at < one_session.len() {
        marker[at] = one_session[at];
        at += 1;
    }
    marker
};
/// The marker, then the level (`u32`, little-endian).
const HEADER_BYTES: usize = MARKER.len() + 4;

/// Why an image did not become a table.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the lock table does not decode: {0}")]
    Undecodable(#[from] bincode::Error),
    #[error(
        "the lock table is at cluster version {level}, and this build (release {release}) \
         knows levels up to {newest}: a newer release wrote it. Run that release or a newer one \
         (docs/upgrading.md, \"Downgrades\")",
        release = crate::RELEASE,
        newest = FeatureLevel::NEWEST
    )]
    TooNew { level: FeatureLevel },
}

pub fn encode(table: &LockTable) -> bincode::Result<Vec<u8>> {
    let level = table.cluster_version();
    if level == FeatureLevel::BASE {
        return bincode::serialize(table);
    }
    let mut bytes = Vec::with_capacity(HEADER_BYTES + 64);
    bytes.extend_from_slice(&MARKER);
    bytes.extend_from_slice(&level.0.to_le_bytes());
    if level < FeatureLevel::SEMAPHORES {
        bincode::serialize_into(&mut bytes, table)?;
        return Ok(bytes);
    }
    // The table's length, the table, then the semaphores.
    with_length(&mut bytes, table)?;
    if level < FeatureLevel::CREDENTIAL_ENDS {
        bincode::serialize_into(&mut bytes, table.semaphores())?;
        return Ok(bytes);
    }
    // Their length too, then the credentials' ends.
    with_length(&mut bytes, table.semaphores())?;
    bincode::serialize_into(&mut bytes, table.acl().ends())?;
    Ok(bytes)
}

/// Appends `value`'s encoding after its length (`u64`, little-endian), so
/// that a decoder knows where the next part starts.
fn with_length(bytes: &mut Vec<u8>, value: &impl serde::Serialize) -> bincode::Result<()> {
    let length_at = bytes.len();
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bincode::serialize_into(&mut *bytes, value)?;
    let length = (bytes.len() - length_at - 8) as u64;
    bytes[length_at..length_at + 8].copy_from_slice(&length.to_le_bytes());
    Ok(())
}

pub fn decode(bytes: &[u8]) -> Result<LockTable, ImageError> {
    let Some(rest) = bytes.strip_prefix(&MARKER) else {
        return Ok(bincode::deserialize(bytes)?);
    };
    let (level, rest) = split(rest, 4)?;
    let level = FeatureLevel(u32::from_le_bytes(level.try_into().expect("four bytes")));
    if level > FeatureLevel::NEWEST {
        return Err(ImageError::TooNew { level });
    }
    if level < FeatureLevel::SEMAPHORES {
        let table: LockTable = bincode::deserialize(rest)?;
        return Ok(table.with_cluster_version(level));
    }
    let (table, rest) = length_prefixed(rest)?;
    let table: LockTable = bincode::deserialize(table)?;
    let table = table.with_cluster_version(level);
    if level < FeatureLevel::CREDENTIAL_ENDS {
        return Ok(table.with_semaphores(bincode::deserialize(rest)?));
    }
    let (semaphores, ends) = length_prefixed(rest)?;
    Ok(table
        .with_semaphores(bincode::deserialize(semaphores)?)
        .with_credential_ends(bincode::deserialize(ends)?))
}

/// The part after a length written by [`with_length`], and the rest.
fn length_prefixed(bytes: &[u8]) -> Result<(&[u8], &[u8]), ImageError> {
    let (length, rest) = split(bytes, 8)?;
    let length = u64::from_le_bytes(length.try_into().expect("eight bytes"));
    split(rest, usize::try_from(length).unwrap_or(usize::MAX))
}

/// The first `at` bytes and the rest, or an error if there are fewer.
fn split(bytes: &[u8], at: usize) -> Result<(&[u8], &[u8]), ImageError> {
    bytes.split_at_checked(at).ok_or_else(|| {
        ImageError::Undecodable(bincode::Error::from(bincode::ErrorKind::Custom(
            "the table image is cut short".to_owned(),
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadbolt_core::{AclCommand, Command, SecretHash};

    /// A table with a session in it, at `level`.
    fn table_at(level: FeatureLevel) -> LockTable {
        let mut table = LockTable::new();
        let open = Command::OpenSession {
            ttl_ms: 10_000,
            secret: SecretHash([7; 32]),
            owner: None,
        };
        assert!(table.apply(&open).outcome.is_ok());
        assert!(table
            .apply(&Command::SetClusterVersion { level })
            .outcome
            .is_ok());
        table
    }

    #[test]
    fn at_the_base_level_the_image_is_what_release_0_1_0_writes_and_reads() {
        let table = table_at(FeatureLevel::BASE);
        let image = encode(&table).unwrap();
        assert_eq!(image, bincode::serialize(&table).unwrap());
        let back = decode(&image).unwrap();
        assert_eq!(back.cluster_version(), FeatureLevel::BASE);
        assert_eq!(back, table);
    }

    #[test]
    fn a_raised_level_travels_in_the_header_and_release_0_1_0_cannot_read_it() {
        let table = table_at(FeatureLevel::CLUSTER_VERSION);
        let image = encode(&table).unwrap();
        assert!(image.starts_with(&MARKER));
        let back = decode(&image).unwrap();
        assert_eq!(back.cluster_version(), FeatureLevel::CLUSTER_VERSION);
        assert_eq!(back, table);
        // How release 0.1.0 decodes a snapshot: it must fail, not drop the
        // level and read on (nor panic).
        let old_release = bincode::deserialize::<LockTable>(&image).unwrap_err();
        assert!(old_release.to_string().contains("tag"), "{old_release}");
    }

    #[test]
    fn from_the_semaphore_level_on_the_semaphores_travel_after_the_table() {
        let mut table = table_at(FeatureLevel::SEMAPHORES);
        let session = deadbolt_core::SessionId(1);
        let permits = Command::AcquirePermits {
            session,
            semaphore: "pool".into(),
            capacity: 4,
            count: 2,
            wait: false,
            attempt: 0,
        };
        // Read/write locks and elections share the semaphores' section:
        // their modes and the leader's value travel too.
        let shared = Command::AcquireRw {
            session,
            lock: "catalog".into(),
            mode: deadbolt_core::RwMode::Shared,
            wait: false,
            attempt: 0,
        };
        let campaign = Command::Campaign {
            session,
            election: "scheduler".into(),
            value: "10.0.0.7:8080".into(),
            wait: false,
            attempt: 0,
        };
        for command in [permits, shared, campaign] {
            assert!(table.apply(&command).outcome.is_ok(), "{command:?}");
        }
        let image = encode(&table).unwrap();
        let back = decode(&image).unwrap();
        assert_eq!(back.semaphores().len(), 3);
        let leader = back.semaphores().election("scheduler").unwrap().leader;
        assert_eq!(leader.2, "10.0.0.7:8080");
        let catalog = back.semaphores().rw_lock("catalog").unwrap();
        assert_eq!(catalog.holders[0].1, deadbolt_core::RwMode::Shared);
        assert_eq!(back, table);
        back.check_invariants();
        assert!(decode(&image[..image.len() - 1]).is_err(), "cut short");
    }

    #[test]
    fn from_the_credential_level_on_expiries_and_the_deny_list_travel_after_the_semaphores() {
        // Its access control has an expiring token (ci0) and a denied
        // identity (laptop-7).
        let table =
            crate::huge_lengths::full_table().with_cluster_version(FeatureLevel::CREDENTIAL_ENDS);
        let image = encode(&table).unwrap();
        let back = decode(&image).unwrap();
        assert_eq!(back.acl().token_expiry("ci0"), Some(1_800_000_000_000));
        assert!(back.acl().denied("laptop-7"));
        assert_eq!(back, table);
        assert!(decode(&image[..image.len() - 1]).is_err(), "cut short");
        // One level down, the same table has no room for them: the image is
        // release 0.2.0's, which a member still on it can read.
        let older = table.clone().with_cluster_version(FeatureLevel::SEMAPHORES);
        let back = decode(&encode(&older).unwrap()).unwrap();
        assert_eq!(back.acl().token_expiry("ci0"), None);
        assert!(!back.acl().denied("laptop-7"));
    }

    // Issue 58, part 1: a snapshot from a peer or the disk whose lengths
    // are made huge, at each level's layout.
    #[test]
    fn every_length_in_a_table_image_is_bounded() {
        let table = crate::huge_lengths::full_table();
        for level in [
            FeatureLevel::BASE,
            FeatureLevel::CLUSTER_VERSION,
            FeatureLevel::SEMAPHORES,
            FeatureLevel::CREDENTIAL_ENDS,
        ] {
            let image = encode(&table.clone().with_cluster_version(level)).unwrap();
            let what = format!("a table image at level {level}");
            crate::huge_lengths::assert_every_length_bounded(
                &what,
                &image,
                crate::untrusted::table_image,
            );
        }
    }

    #[test]
    fn credentials_that_end_are_refused_below_their_level() {
        let mut table = table_at(FeatureLevel::SEMAPHORES);
        let bootstrap = AclCommand::Bootstrap {
            token_id: "root0".into(),
            hash: SecretHash([1; 32]),
        };
        assert!(table.apply(&Command::Acl(bootstrap)).outcome.is_ok());
        let deny = AclCommand::DenyIdentity {
            identity: "laptop-7".into(),
        };
        let refused = table.apply(&Command::Acl(deny)).outcome.unwrap_err();
        assert!(
            matches!(
                refused,
                deadbolt_core::LockError::NeedsClusterVersion { .. }
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_level_from_a_newer_release_is_refused_with_what_to_do() {
        let mut image = encode(&table_at(FeatureLevel::CLUSTER_VERSION)).unwrap();
        let newer = FeatureLevel::NEWEST.0 + 1;
        image[MARKER.len()..HEADER_BYTES].copy_from_slice(&newer.to_le_bytes());
        let err = decode(&image).unwrap_err().to_string();
        assert!(
            err.contains(&format!("cluster version {newer}"))
                && err.contains(crate::RELEASE)
                && err.contains("Downgrades"),
            "{err}"
        );
        assert!(decode(&MARKER).is_err(), "a header cut short decoded");
    }
}

/// The audit trail inside a table image holds lock names as `Arc<str>`
/// since they are shared with the events they come from; before, they were
/// `String`s. A snapshot or backup written by either must read the same.
#[cfg(test)]
mod audit_names {
    use deadbolt_core::{AuditKind, AuditRecord, SessionId, Token};
    use serde::{Deserialize, Serialize};

    /// An audit record as it was declared before its lock name was shared
    /// (release 0.1.0 wrote these).
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct RecordWithAString {
        seq: u64,
        at_ms: u64,
        lock: String,
        session: SessionId,
        token: Token,
        what: AuditKind,
        identity: Option<String>,
    }

    #[test]
    fn an_audit_record_is_written_and_read_as_when_its_lock_name_was_a_string() {
        let record = AuditRecord {
            seq: 41,
            at_ms: 1_764_000_000_000,
            lock: "jobs/nightly-report".into(),
            session: SessionId(7),
            token: Token(1_764_000_000_123),
            what: AuditKind::Granted,
            identity: Some("reporter".to_owned()),
        };
        let before = RecordWithAString {
            seq: 41,
            at_ms: 1_764_000_000_000,
            lock: "jobs/nightly-report".to_owned(),
            session: SessionId(7),
            token: Token(1_764_000_000_123),
            what: AuditKind::Granted,
            identity: Some("reporter".to_owned()),
        };
        let bytes = bincode::serialize(&before).unwrap();
        assert_eq!(bincode::serialize(&record).unwrap(), bytes);
        assert_eq!(bincode::deserialize::<AuditRecord>(&bytes).unwrap(), record);
    }
}
