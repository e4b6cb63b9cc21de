//! Backups of a running cluster's state: `deadbolt snapshot save`, `inspect`
//! and `restore` (docs/operations.md, "Backup and restore").
//!
//! Why a file of our own rather than a copy of a node's data directory: a
//! directory is one node's (its id, its log, its votes, its witness) and a
//! copy taken while the node runs is torn. The file holds only the applied
//! lock table, read by the leader after a linearizable barrier, so it holds
//! every write acknowledged before the save began. It is versioned (a first
//! line `deadbolt-snapshot/N`) and sealed with the CRC-32 every stored record
//! carries (`store/codec.rs`), so a truncated or damaged copy is refused
//! before anything is restored from it.
//!
//! Tokens never go back across a restore: the old cluster may have gone on
//! granting after the save, so the restore raises the token floor past the
//! later of the restoring host's clock and the save's time, plus a margin
//! (default one hour, `--token-margin`) for clock differences and for tokens
//! the old cluster issued faster than one per microsecond. Tokens are
//! microseconds in a `u64`, so the margin costs nothing.

use crate::node::{ApiError, Node};
use crate::raft_types::NodeId;
use crate::store::codec;
use crate::store::table_image;
use crate::store::{seed_data_dir, DataReport};
use deadbolt_core::{FeatureLevel, LockTable, LockTableV9};
use deadbolt_proto::ErrorKind;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The first bytes of every backup, followed by the version and a newline.
const MAGIC: &str = "deadbolt-snapshot/";
/// Bump when [`Contents`] changes incompatibly. Version 3: the table is a
/// table image (`store/table_image.rs`), which records the cluster version;
/// written only once the cluster version is above the base level, so that
/// until then release 0.1.0 restores what this one saves. Version 2: the
/// table holds its limits; version 1 (its table a [`LockTableV9`]) is still
/// read.
pub(crate) const VERSION: u32 = 3;
/// The version written while the cluster version is the base level.
const VERSION_OF_0_1_0: u32 = 2;
/// The largest backup read: above what the table's limits allow (1 M locks
/// with 512-byte names and their queues, 100 000 store values of 64 KiB).
pub const MAX_FILE_BYTES: u64 = 8 << 30;

/// What a backup holds: the table and where in the old cluster's log it
/// was taken. Serialized with the table borrowed, read back owned.
#[derive(Serialize, Deserialize)]
struct Contents<T> {
    /// The saving leader's wall clock, Unix milliseconds.
    saved_at_ms: u64,
    /// The node that answered the save.
    node_id: NodeId,
    /// The last entry applied to the table: its term and index.
    term: u64,
    index: u64,
    table: T,
}

impl<T> Contents<T> {
    /// The same contents with the table turned into another form.
    fn with_table<U, E>(self, convert: impl FnOnce(T) -> Result<U, E>) -> Result<Contents<U>, E> {
        Ok(Contents {
            saved_at_ms: self.saved_at_ms,
            node_id: self.node_id,
            term: self.term,
            index: self.index,
            table: convert(self.table)?,
        })
    }
}

/// A backup read back from its file.
pub struct Backup {
    version: u32,
    contents: Contents<LockTable>,
    file_bytes: u64,
}

/// What `deadbolt snapshot inspect` shows of a backup.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub version: u32,
    pub file_bytes: u64,
    pub saved_at_ms: u64,
    pub node_id: NodeId,
    pub term: u64,
    pub index: u64,
    pub sessions: usize,
    pub locks: usize,
    pub waiters: usize,
    /// The highest token the table shows (held locks, the audit trail,
    /// store fences); 0 if none.
    pub highest_token: u64,
    /// Every token issued before the save is below this.
    pub next_token: u64,
    pub audit_records: usize,
    pub store_keys: usize,
}

/// A backup file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadBackup(String);

fn now_ms() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

/// The backup file of this node's table, after a linearizable barrier (so
/// only the leader answers, with everything committed before the call).
/// Encoded on a blocking thread: a table of a million locks takes a while.
pub(crate) async fn take(node: &Node) -> Result<Vec<u8>, ApiError> {
    node.linearizable().await?;
    let (shared, id) = (node.table.clone(), node.id);
    let encoded = tokio::task::spawn_blocking(move || {
        let state = shared.read().expect("state lock poisoned");
        let last = state.last_applied.unwrap_or_default();
        encode(&Contents {
            saved_at_ms: now_ms(),
            node_id: id,
            term: last.leader_id.term,
            index: last.index,
            table: &state.table,
        })
    })
    .await;
    match encoded {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(err)) => Err(ApiError::new(
            ErrorKind::Internal,
            format!("cannot encode the snapshot: {err}"),
        )),
        Err(err) => Err(ApiError::new(
            ErrorKind::Internal,
            format!("the snapshot task failed: {err}"),
        )),
    }
}

fn encode(contents: &Contents<&LockTable>) -> bincode::Result<Vec<u8>> {
    let (version, body) = if contents.table.cluster_version() == FeatureLevel::BASE {
        (VERSION_OF_0_1_0, bincode::serialize(contents)?)
    } else {
        let with_image = Contents {
            saved_at_ms: contents.saved_at_ms,
            node_id: contents.node_id,
            term: contents.term,
            index: contents.index,
            table: table_image::encode(contents.table)?,
        };
        (VERSION, bincode::serialize(&with_image)?)
    };
    let mut file = format!("{MAGIC}{version}\n").into_bytes();
    file.extend_from_slice(&codec::seal(&body));
    Ok(file)
}

impl Backup {
    /// Reads a backup file's bytes: version, checksum, decoding, and the
    /// table's invariants, all checked.
    pub fn decode(bytes: &[u8]) -> Result<Backup, BadBackup> {
        let bad = |why: String| BadBackup(why);
        let rest = bytes.strip_prefix(MAGIC.as_bytes()).ok_or_else(|| {
            bad("not a Deadbolt snapshot (it does not start with `deadbolt-snapshot/`)".into())
        })?;
        let newline = rest
            .iter()
            .take(16)
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad("its version line is damaged".into()))?;
        let version = std::str::from_utf8(&rest[..newline])
            .ok()
            .and_then(|text| text.parse::<u32>().ok())
            .ok_or_else(|| bad("its version line is damaged".into()))?;
        if !(1..=VERSION).contains(&version) {
            let advice = if version > VERSION {
                "a newer release saved it: restore it with that release or a newer one \
                 (docs/upgrading.md, \"Downgrades\")"
            } else {
                "the file is not a backup this release knows"
            };
            return Err(bad(format!(
                "it is a version {version} snapshot; this build ({}) reads versions 1 to \
                 {VERSION}: {advice}",
                crate::RELEASE
            )));
        }
        let body = codec::unseal(&rest[newline + 1..]).map_err(|err| {
            bad(format!(
                "{err}: the file is truncated or damaged; save a new snapshot"
            ))
        })?;
        let undecodable = |err: bincode::Error| bad(format!("its contents do not decode: {err}"));
        let contents: Contents<LockTable> = match version {
            1 => bincode::deserialize::<Contents<LockTableV9>>(body)
                .map_err(undecodable)?
                .with_table(|old| Ok::<_, BadBackup>(LockTable::from(old)))?,
            2 => bincode::deserialize(body).map_err(undecodable)?,
            _ => bincode::deserialize::<Contents<Vec<u8>>>(body)
                .map_err(undecodable)?
                .with_table(|image| table_image::decode(&image))
                .map_err(|err| bad(err.to_string()))?,
        };
        let table = &contents.table;
        crate::quiet_panic::catch_quietly(|| table.check_invariants()).map_err(|panic| {
            bad(format!(
                "its lock table breaks the lock invariants ({})",
                crate::quiet_panic::message(&*panic)
            ))
        })?;
        Ok(Backup {
            version,
            contents,
            file_bytes: bytes.len() as u64,
        })
    }

    pub fn summary(&self) -> Summary {
        let Contents {
            saved_at_ms,
            node_id,
            term,
            index,
            ref table,
        } = self.contents;
        let locks = table
            .locks_after("")
            .map(|lock| (lock.token, lock.waiters.len()));
        let (mut highest, mut waiters) = (0, 0);
        for (token, queued) in locks {
            highest = highest.max(token.0);
            waiters += queued;
        }
        let audited = table.audit().map(|record| record.token.0);
        let fenced = table.store().fences().map(|(_, fence)| fence.0);
        Summary {
            version: self.version,
            file_bytes: self.file_bytes,
            saved_at_ms,
            node_id,
            term,
            index,
            sessions: table.session_count(),
            locks: table.lock_count(),
            waiters,
            highest_token: audited.chain(fenced).fold(highest, u64::max),
            next_token: table.next_token().0,
            audit_records: table.audit().count(),
            store_keys: table.store().len(),
        }
    }

    /// Writes a new data directory `dir` for node `node_id`, the single
    /// member of a new cluster, serving at `address`, from this backup.
    /// Its tokens start above `max(now, saved_at) + token_margin`. The
    /// sessions stay, with their locks and queues; their leases start
    /// afresh on the new leader, as after any leader change.
    pub fn restore(
        mut self,
        dir: &Path,
        node_id: NodeId,
        address: &str,
        token_margin: Duration,
    ) -> anyhow::Result<DataReport> {
        let margin_ms = u64::try_from(token_margin.as_millis()).unwrap_or(u64::MAX);
        let floor_ms = deadbolt_core::token_floor_ms(
            now_ms()
                .max(self.contents.saved_at_ms)
                .saturating_add(margin_ms),
        );
        self.contents.table.raise_token_floor(floor_ms);
        seed_data_dir(dir, node_id, address, &self.contents.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadbolt_core::{Command, SecretHash};

    /// A backup of a table with one session, at cluster version `level`.
    fn sample_at(level: FeatureLevel) -> Vec<u8> {
        let mut table = LockTable::new();
        table.apply(&Command::OpenSession {
            ttl_ms: 10_000,
            secret: SecretHash([7; 32]),
            owner: None,
        });
        table.apply(&Command::SetClusterVersion { level });
        encode(&Contents {
            saved_at_ms: 1,
            node_id: 1,
            term: 2,
            index: 3,
            table: &table,
        })
        .unwrap()
    }

    fn sample() -> Vec<u8> {
        sample_at(FeatureLevel::BASE)
    }

    // Issue 58, part 1: a backup file whose checksum is right (it is no
    // secret: anyone can seal what they like) and whose lengths are huge.
    #[test]
    fn every_length_in_a_backup_is_bounded() {
        let full = crate::huge_lengths::full_table();
        for level in [FeatureLevel::BASE, FeatureLevel::NEWEST] {
            let file = encode(&Contents {
                saved_at_ms: 1,
                node_id: 1,
                term: 2,
                index: 3,
                table: &full.clone().with_cluster_version(level),
            })
            .unwrap();
            let newline = file.iter().position(|&b| b == b'\n').unwrap();
            let (version_line, sealed) = file.split_at(newline + 1);
            let body = codec::unseal(sealed).unwrap();
            let what = format!("a backup at level {level}");
            crate::huge_lengths::assert_every_length_bounded(&what, body, |body| {
                let mut file = version_line.to_vec();
                file.extend_from_slice(&codec::seal(body));
                crate::untrusted::backup(&file)
            });
        }
    }

    #[test]
    fn a_backup_records_the_cluster_version_once_it_moved_and_only_then() {
        let base = sample();
        assert!(
            base.starts_with(b"deadbolt-snapshot/2\n"),
            "release 0.1.0 could not restore it"
        );
        let backup = Backup::decode(&base).unwrap();
        assert_eq!(backup.contents.table.cluster_version(), FeatureLevel::BASE);

        let raised = sample_at(FeatureLevel::CLUSTER_VERSION);
        assert!(raised.starts_with(b"deadbolt-snapshot/3\n"));
        let backup = Backup::decode(&raised).unwrap();
        assert_eq!(backup.summary().version, 3);
        assert_eq!(backup.summary().sessions, 1);
        let table = &backup.contents.table;
        assert_eq!(table.cluster_version(), FeatureLevel::CLUSTER_VERSION);
        // Restored, the data directory keeps the level.
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let report = backup
            .restore(&data, 1, "127.0.0.1:7070", Duration::ZERO)
            .unwrap();
        assert_eq!(report.cluster_version, FeatureLevel::CLUSTER_VERSION.0);
    }

    #[test]
    fn a_backup_of_a_newer_release_is_refused_with_what_to_do() {
        let newer = format!("deadbolt-snapshot/{}\n", VERSION + 1);
        let err = Backup::decode(newer.as_bytes()).err().unwrap().to_string();
        assert!(
            err.contains(&format!("version {}", VERSION + 1))
                && err.contains(crate::RELEASE)
                && err.contains("a newer release saved it"),
            "{err}"
        );
    }

    /// `testdata/before-limits.snap`: saved by the build before the table
    /// held its limits (commit 00d808a) from a node with two sessions
    /// holding `fixture/a` and `fixture/b`, a store key and access control
    /// on; `deadbolt snapshot inspect` of that build read it as 2 sessions,
    /// 2 locks, 2 audit records, 1 store key.
    #[test]
    fn a_version_1_backup_from_before_the_table_held_limits_still_reads() {
        let file = include_bytes!("../testdata/before-limits.snap");
        assert!(file.starts_with(b"deadbolt-snapshot/1\n"));
        let backup = Backup::decode(file).unwrap();
        let summary = backup.summary();
        assert_eq!(summary.version, 1);
        assert_eq!((summary.sessions, summary.locks), (2, 2));
        assert_eq!((summary.audit_records, summary.store_keys), (2, 1));
        let table = &backup.contents.table;
        assert_eq!(table.table_limits(), deadbolt_core::TableLimits::DEFAULT);
        assert!(table.acl().enabled());
        assert!(table.lock("fixture/a").is_some());
        // Restored, it is a current data directory that holds the same.
        let dir = tempfile::tempdir().unwrap();
        let report = backup
            .restore(
                &dir.path().join("data"),
                1,
                "127.0.0.1:7070",
                Duration::ZERO,
            )
            .unwrap();
        assert_eq!((report.sessions, report.locks), (2, 2));
    }

    #[test]
    fn a_backup_reads_back_and_every_damage_is_refused() {
        let file = sample();
        let summary = Backup::decode(&file).unwrap().summary();
        assert_eq!((summary.sessions, summary.term, summary.index), (1, 2, 3));
        for len in 0..file.len() {
            assert!(Backup::decode(&file[..len]).is_err(), "truncated to {len}");
        }
        for byte in 0..file.len() {
            let mut damaged = file.clone();
            damaged[byte] ^= 0x10;
            assert!(Backup::decode(&damaged).is_err(), "byte {byte} flipped");
        }
    }
}
