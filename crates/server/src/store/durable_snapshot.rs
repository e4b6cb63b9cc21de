//! How far the snapshot this node holds on disk reaches: the log store may
//! purge no further.
//!
//! openraft 0.9 purges the log that a snapshot from the leader covers as
//! soon as it hands the snapshot to the state machine, without waiting for
//! it to be written (`install_full_snapshot` queues `PurgeLog` with no
//! condition). A crash, or a failed write, between the two left a log
//! purged past the snapshot on disk: a directory that every later start
//! refused as damaged, so the node had to be rebuilt from its peers. The
//! simulation's failed syncs found it (seed 224). So a purge waits until a
//! snapshot reaching that far is durable, and fails if writing it did.

use super::At;
use crate::raft_types::{NodeId, StorageError};
use openraft::{ErrorSubject, ErrorVerb, LogId};
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Durable {
    /// The last log index the durable snapshot covers, if there is one.
    UpTo(Option<u64>),
    /// Writing a snapshot failed: this node stops, and purges nothing more.
    Failed(String),
}

/// Kept by the state machine, which writes snapshots.
#[derive(Clone)]
pub struct SnapshotWritten(Arc<watch::Sender<Durable>>);

/// Kept by the log store, whose purges wait for it.
#[derive(Clone)]
pub struct SnapshotOnDisk(watch::Receiver<Durable>);

impl SnapshotWritten {
    /// For a node whose durable snapshot covers up to `index`.
    pub fn new(index: Option<u64>) -> Self {
        SnapshotWritten(Arc::new(watch::Sender::new(Durable::UpTo(index))))
    }

    pub fn on_disk(&self) -> SnapshotOnDisk {
        SnapshotOnDisk(self.0.subscribe())
    }

    /// A snapshot covering up to `index` is durable.
    pub fn reached(&self, index: Option<u64>) {
        self.0.send_if_modified(|durable| match durable {
            Durable::UpTo(before) if index > *before => {
                *durable = Durable::UpTo(index);
                true
            }
            _ => false,
        });
    }

    /// Writing a snapshot failed.
    pub fn failed(&self, err: &StorageError) {
        self.0.send_replace(Durable::Failed(err.to_string()));
    }
}

impl SnapshotOnDisk {
    /// For openraft's storage suite, which purges logs that no snapshot
    /// covers; openraft itself never does (its purges stay within the
    /// snapshot it knows of).
    #[cfg(test)]
    pub fn covering_everything() -> Self {
        SnapshotWritten::new(Some(u64::MAX)).on_disk()
    }

    /// Returns once a durable snapshot covers `log_id`; an error if writing
    /// one failed, or the state machine is gone.
    pub async fn covers(&mut self, log_id: &LogId<NodeId>) -> Result<(), StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Delete);
        let durable = self
            .0
            .wait_for(|durable| match durable {
                Durable::UpTo(index) => *index >= Some(log_id.index),
                Durable::Failed(_) => true,
            })
            .await
            .map(|durable| durable.clone());
        let why = match durable {
            Ok(Durable::UpTo(_)) => return Ok(()),
            Ok(Durable::Failed(why)) => format!(
                "the snapshot covering log index {} could not be written: {why}",
                log_id.index
            ),
            Err(_) => "the state machine stopped before its snapshot was written".to_owned(),
        };
        Err(openraft::StorageIOError::new(at.0, at.1, openraft::AnyError::error(why)).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn durable_snapshot(index: Option<u64>) -> (SnapshotWritten, SnapshotOnDisk) {
        let written = SnapshotWritten::new(index);
        let on_disk = written.on_disk();
        (written, on_disk)
    }

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    #[tokio::test(start_paused = true)]
    async fn seed_224_a_purge_waits_for_the_snapshot_that_covers_it() {
        use futures::FutureExt;
        let (written, mut on_disk) = durable_snapshot(Some(199));
        on_disk.covers(&log_id(199)).await.unwrap();
        let mut purge = Box::pin(async move { on_disk.covers(&log_id(400)).await });
        assert!(
            (&mut purge).now_or_never().is_none(),
            "no snapshot reaches 400 yet"
        );
        written.reached(Some(300));
        assert!(
            (&mut purge).now_or_never().is_none(),
            "300 is not far enough"
        );
        written.reached(Some(400));
        assert!(matches!(purge.now_or_never(), Some(Ok(()))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_purge_fails_when_its_snapshot_could_not_be_written() {
        let (written, mut on_disk) = durable_snapshot(None);
        let failure = openraft::StorageIOError::write_snapshot(
            None,
            openraft::AnyError::error("I/O error (EIO)"),
        );
        written.failed(&failure.into());
        let err = on_disk.covers(&log_id(1)).await.unwrap_err();
        assert!(err.to_string().contains("EIO"), "{err}");
        drop(written);
        let (written, mut on_disk) = durable_snapshot(None);
        drop(written);
        assert!(on_disk.covers(&log_id(1)).await.is_err());
    }
}
