//! [`LogStore`]: openraft's log storage on redb.
//!
//! `append` commits one redb transaction (fsync) and only then tells openraft
//! the entries are durable, so nothing is acknowledged before it is on disk.

use super::{At, OrStorageError, LOG, META};
use crate::raft_types::{NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, Vote};
use redb::{Database, ReadableTable};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

const VOTE_KEY: &str = "vote";
const PURGED_KEY: &str = "last_purged";

#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub fn new(db: Arc<Database>) -> Self {
        LogStore { db }
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StorageError> {
        let at = At(ErrorSubject::Store, ErrorVerb::Read);
        let txn = self.db.begin_read().at(&at)?;
        let table = txn.open_table(META).at(&at)?;
        match table.get(key).at(&at)? {
            Some(bytes) => Ok(Some(bincode::deserialize(bytes.value()).at(&at)?)),
            None => Ok(None),
        }
    }

    fn write_meta<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        subject: ErrorSubject<NodeId>,
    ) -> Result<(), StorageError> {
        let at = At(subject.clone(), ErrorVerb::Write);
        let bytes = bincode::serialize(value).at(&at)?;
        let txn = self.db.begin_write().at(&at)?;
        txn.open_table(META)
            .at(&at)?
            .insert(key, bytes.as_slice())
            .at(&at)?;
        txn.commit().at(&at)
    }
}

/// Appends entries in one redb transaction, committed with
/// `Durability::Immediate`: fsync'd when this returns `Ok`.
fn write_entries(db: &Database, entries: &[Entry<TypeConfig>]) -> Result<(), StorageError> {
    let at = At(ErrorSubject::Logs, ErrorVerb::Write);
    let txn = db.begin_write().at(&at)?;
    {
        let mut table = txn.open_table(LOG).at(&at)?;
        for entry in entries {
            let bytes = bincode::serialize(entry).at(&at)?;
            table.insert(entry.log_id.index, bytes.as_slice()).at(&at)?;
        }
    }
    txn.commit().at(&at)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Read);
        let txn = self.db.begin_read().at(&at)?;
        let table = txn.open_table(LOG).at(&at)?;
        let mut entries = Vec::new();
        for item in table.range(range).at(&at)? {
            let (_, bytes) = item.at(&at)?;
            entries.push(bincode::deserialize(bytes.value()).at(&at)?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Read);
        let last_purged_log_id: Option<LogId<NodeId>> = self.read_meta(PURGED_KEY)?;
        let txn = self.db.begin_read().at(&at)?;
        let table = txn.open_table(LOG).at(&at)?;
        let last = match table.last().at(&at)? {
            Some((_, bytes)) => {
                let entry: Entry<TypeConfig> = bincode::deserialize(bytes.value()).at(&at)?;
                Some(entry.log_id)
            }
            None => None,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_meta(VOTE_KEY, vote, ErrorSubject::Vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE_KEY)
    }

    /// Writes on a blocking thread: the commit waits for the disk, and a
    /// tokio worker stalled on fsync could not serve the network meanwhile.
    /// openraft waits for the callback before its next log operation, so
    /// appends never overlap.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let written = write_entries(&db, &entries);
            if let Err(err) = &written {
                tracing::error!(%err, "appending to the raft log failed");
            }
            // Only after the commit (fsync) returned may openraft count
            // these entries as persisted.
            callback.log_io_completed(written.map_err(|e| std::io::Error::other(e.to_string())));
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Delete);
        let txn = self.db.begin_write().at(&at)?;
        txn.open_table(LOG)
            .at(&at)?
            .retain_in(log_id.index.., |_, _| false)
            .at(&at)?;
        txn.commit().at(&at)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Delete);
        let bytes = bincode::serialize(&log_id).at(&at)?;
        // The purge marker and the deletion commit together, so a crash
        // never leaves a gap that get_log_state does not know about.
        let txn = self.db.begin_write().at(&at)?;
        txn.open_table(META)
            .at(&at)?
            .insert(PURGED_KEY, bytes.as_slice())
            .at(&at)?;
        txn.open_table(LOG)
            .at(&at)?
            .retain_in(..=log_id.index, |_, _| false)
            .at(&at)?;
        txn.commit().at(&at)
    }
}
