//! Reading a whole database before trusting it: [`verify`] checks every
//! record against its checksum and the log against the witness, and replays
//! the log onto the snapshot into a [`DataReport`].
//!
//! Why a full read at every start: a damaged record found later, while
//! serving, stops the node mid-flight (openraft treats storage errors as
//! fatal) after it may already have voted or answered from a wrong state.
//! Found before the node starts, it is a clear refusal that names the file.
//! The log is bounded by the snapshot interval, so this is one pass over at
//! most `--snapshot-every` entries plus one snapshot decode.

use super::log_file::{scan, SegmentDir};
use super::state_machine::{apply_entry, decode_table, decode_table_v9, Applied, StoredSnapshot};
use super::table_image::ImageError;
use super::witness::Witness;
use super::{
    decode, snapshot_chunks, At, FORMAT, FORMAT_KEY, FORMAT_LOG_IN_DATABASE,
    FORMAT_SNAPSHOT_IN_LOG, FORMAT_SNAPSHOT_IN_ONE_VALUE, INSTANCE_KEY, LOG, META, PURGED_KEY,
    SNAPSHOT_KEY, VOTE_KEY,
};
use crate::raft_types::{NodeId, TypeConfig};
use deadbolt_core::FeatureLevel;
use openraft::{Entry, ErrorSubject, ErrorVerb, LogId, Vote};
use redb::Database;
use serde::Serialize;

/// What a sound database holds, for `deadbolt data check` and the start-up
/// log line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DataReport {
    pub node_id: NodeId,
    /// The instance id, in hex.
    pub instance: String,
    pub vote: Option<String>,
    /// The first and last log index kept, if any entry is.
    pub log_first: Option<u64>,
    pub log_last: Option<u64>,
    /// Entries up to here were compacted into the snapshot.
    pub purged: Option<u64>,
    pub snapshot_last: Option<u64>,
    /// Members of the cluster as of the last membership entry.
    pub members: Vec<NodeId>,
    /// The state after replaying every kept entry onto the snapshot (on a
    /// cluster node, entries not yet committed are replayed too).
    pub next_token: u64,
    pub sessions: usize,
    pub locks: usize,
    /// Blocking acquires queued behind a holder.
    pub waiters: usize,
    pub store_keys: usize,
    /// Names held or waited on as semaphores, read/write locks, elections.
    pub semaphores: usize,
    pub rw_locks: usize,
    pub elections: usize,
    /// The feature level the state is at (`deadbolt_core::FeatureLevel`).
    pub cluster_version: u32,
}

/// Why a database is refused.
#[derive(Debug)]
pub enum Refusal {
    /// Written by another build; not damaged, but not for this one.
    WrongFormat(String),
    /// The problem with the log database, in words for the operator.
    Damaged(String),
    /// The problem with the snapshot database.
    SnapshotDamaged(String),
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Refusal::Damaged(reason)
    }
}

type Damage = String;

/// Reads all of `db` and `snapshots` (overlay copies: see `overlay.rs`) and
/// checks them against `witness`. Panics of the storage library on damaged
/// pages are the caller's to catch.
pub fn verify(
    db: &Database,
    snapshots: Option<&Database>,
    segments: &dyn SegmentDir,
    witness: &Witness,
) -> Result<DataReport, Refusal> {
    let at = At(ErrorSubject::Store, ErrorVerb::Read);
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let meta = txn
        .open_table(META)
        .map_err(|e| format!("its metadata table is unreadable: {e}"))?;
    let raw = |key: &str| raw_value(&meta, key);

    // (Whether the snapshot is in the log database, whether the log is.)
    let (snapshot_in_log, log_in_database) = match raw(FORMAT_KEY)? {
        Some(format) if format == FORMAT => (false, false),
        // Opening for writing moves the log into segments.
        Some(format) if format == FORMAT_LOG_IN_DATABASE => (false, true),
        // Opening for writing cuts the snapshot into chunks; until then
        // `snapshot_chunks::read` finds it as it is.
        Some(format) if format == FORMAT_SNAPSHOT_IN_ONE_VALUE => (false, true),
        // Opening for writing moves the snapshot to its own database.
        Some(format) if format == FORMAT_SNAPSHOT_IN_LOG => (true, true),
        Some(format) => {
            return Err(Refusal::WrongFormat(
                String::from_utf8_lossy(&format).into_owned(),
            ))
        }
        None => return Err(Refusal::Damaged("it has no format marker".into())),
    };
    let instance = instance_of(raw(INSTANCE_KEY)?, witness, &at)?;
    let vote: Option<Vote<NodeId>> = decoded(raw(VOTE_KEY)?, "the vote", &at)?;
    let purged: Option<LogId<NodeId>> = decoded(raw(PURGED_KEY)?, "the purge marker", &at)?;
    let snapshot: Option<StoredSnapshot> = match (snapshot_in_log, snapshots) {
        (true, _) => decoded(raw(SNAPSHOT_KEY)?, "the snapshot", &at)?,
        (false, Some(snapshots)) => {
            read_snapshot(snapshots, witness, &at).map_err(Refusal::SnapshotDamaged)?
        }
        (false, None) => None,
    };

    let mut state = Applied::default();
    if let Some(snapshot) = &snapshot {
        let decode = match snapshot_in_log {
            true => decode_table_v9,
            false => decode_table,
        };
        state.table = decode(snapshot).map_err(|err| match err {
            too_new @ ImageError::TooNew { .. } => Refusal::WrongFormat(too_new.to_string()),
            ImageError::Undecodable(_) => Refusal::SnapshotDamaged(format!("the snapshot: {err}")),
        })?;
        state.last_applied = snapshot.meta.last_log_id;
        state.membership = snapshot.meta.last_membership.clone();
    }
    let snapshot_last = snapshot.as_ref().and_then(|s| s.meta.last_log_id);
    if purged.map(|p| p.index) > snapshot_last.map(|s| s.index) {
        // The log is intact; the snapshot that replaced its compacted part
        // is missing or older than it was.
        return Err(Refusal::SnapshotDamaged(format!(
            "the log was compacted up to index {} but the snapshot only reaches {} \
             (the snapshot file was lost, replaced or went back to an older state)",
            purged.map_or(0, |p| p.index),
            snapshot_last.map_or("nothing".to_owned(), |s| format!("index {}", s.index))
        )));
    }

    // Every entry past the purge marker: intact, in place, contiguous.
    let kept = match log_in_database {
        true => entries_in_table(&txn, purged, &at)?,
        false => scan(segments, purged)
            .and_then(|scanned| scanned.index.read(purged.map_or(0, |p| p.index + 1)..))
            .map_err(|e| format!("its log: {e}"))?,
    };
    let mut expected = purged.map(|p| p.index + 1);
    let (mut first, mut last) = (None, None);
    let mut events = Vec::new();
    for entry in kept {
        let index = entry.log_id.index;
        if expected.is_some_and(|expected| expected != index) {
            return Err(format!(
                "the log is not contiguous: entry {index} follows {}",
                last.map_or("the start".to_owned(), |l: LogId<NodeId>| l
                    .index
                    .to_string())
            )
            .into());
        }
        if last.is_some_and(|last| entry.log_id < last) {
            return Err(
                format!("log entry {index} is of an older term than the one before it").into(),
            );
        }
        first.get_or_insert(index);
        last = Some(entry.log_id);
        expected = Some(index + 1);
        if Some(entry.log_id) > state.last_applied {
            events.clear();
            apply_entry(&mut state, entry, &mut events, None, FeatureLevel::NEWEST)
                .map_err(|err| Refusal::WrongFormat(err.to_string()))?;
        }
    }
    if let (Some(first), Some(snapshot_last)) = (first, snapshot_last) {
        if first > snapshot_last.index + 1 {
            return Err(format!(
                "the log starts at index {first} but the snapshot ends at {}: entries in between are missing",
                snapshot_last.index
            ).into());
        }
    }
    // As `LogStore::get_log_state` computes it.
    let last_log = last.max(purged);
    witness
        .check(last_log, vote.as_ref())
        .map_err(|reason| format!("{reason}; its witness expected more"))?;
    // Cheap insurance: the replayed table must hold the lock invariants.
    state.table.check_invariants();

    let (semaphores, rw_locks, elections) = state.table.semaphores().count_by_kind();
    Ok(DataReport {
        node_id: witness.node_id,
        instance: format!("{instance:032x}"),
        vote: vote.map(|vote| vote.to_string()),
        log_first: first,
        log_last: last.map(|l| l.index),
        purged: purged.map(|p| p.index),
        snapshot_last: snapshot_last.map(|s| s.index),
        members: state.membership.membership().voter_ids().collect(),
        next_token: state.table.next_token().0,
        sessions: state.table.session_count(),
        locks: state.table.lock_count(),
        waiters: state.table.waits().count(),
        store_keys: state.table.store().len(),
        semaphores,
        rw_locks,
        elections,
        cluster_version: state.table.cluster_version().0,
    })
}

/// The entries past `purged` of a log kept in a database table (formats
/// up to 11), each checked to stand at its own index: read to check it,
/// and to move it into segments.
pub(super) fn entries_in_table(
    txn: &redb::ReadTransaction,
    purged: Option<LogId<NodeId>>,
    at: &At,
) -> Result<Vec<Entry<TypeConfig>>, Damage> {
    // A database without the table holds no entry (the witness says
    // whether it should).
    let log = match txn.open_table(LOG) {
        Ok(log) => log,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(format!("its log table is unreadable: {e}")),
    };
    let mut entries = Vec::new();
    let kept = log
        .range(purged.map_or(0, |p| p.index + 1)..)
        .map_err(|e| e.to_string())?;
    for item in kept {
        let (key, bytes) = item.map_err(|e| format!("the log: {e}"))?;
        let index = key.value();
        let entry: Entry<TypeConfig> =
            decode(bytes.value(), at).map_err(|e| format!("log entry {index}: {e}"))?;
        if entry.log_id.index != index {
            return Err(format!(
                "the log is not contiguous: entry {} stands at index {index}",
                entry.log_id.index
            ));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// The bytes `key` holds in a `META` table.
fn raw_value(
    meta: &impl redb::ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<Vec<u8>>, Damage> {
    Ok(meta
        .get(key)
        .map_err(|e| format!("{key}: {e}"))?
        .map(|value| value.value().to_vec()))
}

/// The instance id a database holds, if it is the witness's.
fn instance_of(bytes: Option<Vec<u8>>, witness: &Witness, at: &At) -> Result<u128, Damage> {
    let instance: u128 = match bytes {
        Some(bytes) => decode(&bytes, at).map_err(|e| format!("its instance id: {e}"))?,
        None => return Err("it has no instance id".into()),
    };
    if instance != witness.instance {
        return Err(format!(
            "it belongs to another data directory (instance {instance:032x}, the witness says {:032x})",
            witness.instance
        ));
    }
    Ok(instance)
}

/// The snapshot database's snapshot, if it is this directory's.
fn read_snapshot(
    snapshots: &Database,
    witness: &Witness,
    at: &At,
) -> Result<Option<StoredSnapshot>, Damage> {
    let txn = snapshots.begin_read().map_err(|e| e.to_string())?;
    let meta = txn
        .open_table(META)
        .map_err(|e| format!("its table is unreadable: {e}"))?;
    instance_of(raw_value(&meta, INSTANCE_KEY)?, witness, at)?;
    let sealed = snapshot_chunks::read(&txn).map_err(|e| format!("the snapshot: {e}"))?;
    decoded(sealed, "the snapshot", at)
}

fn decoded<T: serde::de::DeserializeOwned>(
    bytes: Option<Vec<u8>>,
    what: &str,
    at: &At,
) -> Result<Option<T>, Damage> {
    bytes
        .map(|bytes| decode(&bytes, at).map_err(|e| format!("{what}: {e}")))
        .transpose()
}
