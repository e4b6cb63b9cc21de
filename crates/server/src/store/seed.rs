//! [`seed_data_dir`]: a new data directory whose state starts from a given
//! lock table (`deadbolt snapshot restore`), as if a single-node cluster had
//! been formed, snapshotted that table and compacted its log.
//!
//! Why a snapshot at the very first log position rather than, say, commands
//! replayed into a fresh log: a learner added later must get the restored
//! state, and openraft sends a snapshot only for entries no longer in the
//! log. With the log compacted up to the seeded snapshot, every member added
//! with `deadbolt cluster add` starts from the snapshot, then follows the log.
//! Written through the same checked paths as a running node's data (the
//! witness first, sealed records), and checked like any directory before
//! the caller hears it is done.

use super::state_machine::StoredSnapshot;
use super::verify::DataReport;
use super::{
    check_data_dir, encode, open_data_dir, snapshot_chunks, write_meta, At, OrStorageError,
    PURGED_KEY,
};
use crate::raft_types::NodeId;
use anyhow::Context;
use deadbolt_core::LockTable;
use openraft::{
    BasicNode, ErrorSubject, ErrorVerb, LogId, Membership, SnapshotMeta, StoredMembership,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Creates `dir` (which must not exist or be empty) holding `table` for
/// node `node_id`, the only member, serving at `address`. Returns what
/// `deadbolt data check` reports on it.
pub fn seed_data_dir(
    dir: &Path,
    node_id: NodeId,
    address: &str,
    table: &LockTable,
) -> anyhow::Result<DataReport> {
    refuse_non_empty(dir)?;
    let mut data = open_data_dir(dir, node_id)?;
    // The position `initialize` gives a new cluster's first entry.
    let log_id = LogId::<NodeId>::default();
    let membership = Membership::new(
        vec![BTreeSet::from([node_id])],
        BTreeMap::from([(node_id, BasicNode::new(address))]),
    );
    let at = At(ErrorSubject::Snapshot(None), ErrorVerb::Write);
    let snapshot = StoredSnapshot {
        meta: SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: StoredMembership::new(Some(log_id), membership),
            snapshot_id: "restored".to_owned(),
        },
        data: super::table_image::encode(table).at(&at)?,
    };
    snapshot_chunks::write(&data.snapshots, &encode(&snapshot, &at)?).at(&at)?;
    write_meta(&data.db, PURGED_KEY, &log_id, ErrorSubject::Logs)?;
    // The database first, then its witness: never behind it.
    data.witness
        .record_last_log(Some(log_id))
        .context("cannot record the restored log position in the witness")?;
    drop(data);
    Ok(check_data_dir(dir)?)
}

fn refuse_non_empty(dir: &Path) -> anyhow::Result<()> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", dir.display())),
    };
    if let Some(entry) = entries.next() {
        anyhow::bail!(
            "refusing to restore into {}: it is not empty (it holds {:?}); give a new or empty \
             --data-dir, never a running or old node's",
            dir.display(),
            entry?.file_name()
        );
    }
    Ok(())
}
