//! [`LogStore`]: openraft's log storage on redb.
//!
//! `append` commits one redb transaction (fsync) and only then tells openraft
//! the entries are durable, so nothing is acknowledged before it is on disk.

use super::{At, OrStorageError, LOG, META};
use crate::raft_types::{NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, Vote};
use redb::{Database, Durability, ReadableTable};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
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
        durability: Durability,
    ) -> Result<(), StorageError> {
        let at = At(subject.clone(), ErrorVerb::Write);
        let bytes = bincode::serialize(value).at(&at)?;
        let mut txn = self.db.begin_write().at(&at)?;
        txn.set_durability(durability);
        txn.open_table(META)
            .at(&at)?
            .insert(key, bytes.as_slice())
            .at(&at)?;
        txn.commit().at(&at)
    }
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
        self.write_meta(VOTE_KEY, vote, ErrorSubject::Vote, Durability::Immediate)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE_KEY)
    }

    /// Only an optimisation (how far to re-apply at start), so it is not
    /// fsync'd on its own: the next durable append carries it to disk. A
    /// lost value means re-applying less at start and catching up from the
    /// leader's commit index instead.
    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError> {
        self.write_meta(
            COMMITTED_KEY,
            &committed,
            ErrorSubject::Store,
            Durability::None,
        )
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError> {
        Ok(self
            .read_meta::<Option<LogId<NodeId>>>(COMMITTED_KEY)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let at = At(ErrorSubject::Logs, ErrorVerb::Write);
        let txn = self.db.begin_write().at(&at)?;
        {
            let mut table = txn.open_table(LOG).at(&at)?;
            for entry in entries {
                let bytes = bincode::serialize(&entry).at(&at)?;
                table.insert(entry.log_id.index, bytes.as_slice()).at(&at)?;
            }
        }
        // Durability::Immediate: fsync'd when commit returns, and only then
        // may openraft count these entries as persisted.
        match txn.commit() {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e).at(&at)
            }
        }
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
