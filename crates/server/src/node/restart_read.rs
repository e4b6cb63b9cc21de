//! [`StartupLog`]: no linearizable read from a leader that came back in its
//! own term before it has applied, again, everything it held at the restart.
//!
//! Why: openraft 0.9 restores a node that led when it stopped as leader of
//! the same term at once (when nobody else was elected meanwhile), with no
//! new entry, and takes that term's first entry as the read index. Entries
//! the node committed and acknowledged after that one, but applied again
//! only once its followers confirm them (it restarts from an older
//! snapshot), were missing from its reads: a nemesis run saw a session
//! called "unknown" and an acquire on it refused while its grant stood
//! (`testdata/nemesis-findings/2026-12-04-semaphore-older-token`). Waiting
//! for the log as of the restart closes that gap: a leader's own log holds
//! every entry committed in its term. In any later term a new leader's
//! first entry comes after all of it, and openraft's read index suffices.
//! Lease tracking had met the same gap in the simulation and waits for its
//! own (`leases::applied_all_before_leading`); reads had not.

use super::error::ApiError;
use crate::raft_types::{NodeId, Raft, StorageError, TypeConfig};
use deadbolt_proto::ErrorKind;
use openraft::storage::RaftLogStorage;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::time::Instant;

/// The node's Raft log as it started.
pub(crate) struct StartupLog {
    /// The term of the vote the node started with.
    term: u64,
    /// The index of the last entry in its log then.
    last_index: Option<u64>,
    /// Set once that entry is applied, or a later term began.
    caught_up: AtomicBool,
}

impl StartupLog {
    /// Reads the vote and the last entry from the log store, before Raft
    /// starts on it.
    pub(crate) async fn read<S: RaftLogStorage<TypeConfig>>(
        log_store: &mut S,
    ) -> Result<StartupLog, StorageError> {
        let vote: Option<openraft::Vote<NodeId>> = log_store.read_vote().await?;
        let last = log_store.get_log_state().await?.last_log_id;
        Ok(StartupLog {
            term: vote.map_or(0, |vote| vote.leader_id().term),
            last_index: last.map(|id| id.index),
            caught_up: AtomicBool::new(last.is_none()),
        })
    }

    /// Waits until `raft` has applied the log as of the start, if it leads
    /// in the term it started in, until `give_up`. Called after openraft's
    /// own read barrier passed.
    pub(crate) async fn applied(&self, raft: &Raft, give_up: Instant) -> Result<(), ApiError> {
        if self.caught_up.load(Ordering::Acquire) {
            return Ok(());
        }
        let (term, applied) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            (
                metrics.current_term,
                metrics.last_applied.map(|id| id.index),
            )
        };
        if term != self.term || applied >= self.last_index {
            self.caught_up.store(true, Ordering::Release);
            return Ok(());
        }
        let within = give_up.saturating_duration_since(Instant::now());
        raft.wait(Some(within))
            .applied_index_at_least(self.last_index, "the log as of the restart")
            .await
            .map_err(|_| {
                let message = format!(
                    "this node restarted as leader and has not yet applied its log up to \
                     index {} again (its followers must confirm it first); retry",
                    self.last_index.unwrap_or(0)
                );
                ApiError::new(ErrorKind::Unavailable, message)
            })?;
        self.caught_up.store(true, Ordering::Release);
        Ok(())
    }
}
