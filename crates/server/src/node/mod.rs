//! [`Node`]: the lock service's operations, independent of the wire.
//!
//! The gRPC and HTTP front ends both call these methods and only translate
//! requests and [`ApiError`]s. Every change goes through the [`Proposer`]
//! (Raft) as a typed [`Proposal`], whose answer is read in one place
//! ([`Node::propose_with`]); reads that decide anything pass a linearizable
//! barrier first.
//!
//! The parts with reasons of their own live beside this: `error.rs`
//! ([`ApiError`]), `acquire.rs` (the acquire call, which outlives its
//! request, and the abandonment of what its caller never learned of) and
//! `observers.rs` (what the store's apply path tells the rest of the node).

mod abandoned;
pub(crate) mod acquire;
mod error;
mod observers;
mod restart_read;

pub use error::ApiError;

/// A linearizable read and the log index of the state it read: a watch
/// after that index goes on from exactly that state, with no event missed
/// or repeated (docs/watches.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indexed<T> {
    pub value: T,
    pub index: u64,
}
pub(crate) use observers::Observers;
pub(crate) use restart_read::StartupLog;

use crate::leases::{KeepAliveError, Leases};
use crate::metrics::Metrics;
use crate::proposer::{Admission, Pace, Proposer};
use crate::raft_types::{NodeId, Raft};
use crate::store::SharedTable;
use crate::waits::Waits;
use deadbolt_core::{
    validate_key, validate_lock_name, validate_ttl, AccessControl, AclCommand, AuditRecord,
    Command, FeatureLevel, LockError, LockInfo, LockTable, Proposal, SecretHash, SessionId,
    SessionSecret, StoredValue, Token,
};
use deadbolt_proto::ErrorKind;
use futures::FutureExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Node state for the health endpoint.
#[derive(Debug, Clone)]
pub struct Health {
    pub node_id: NodeId,
    pub leader: bool,
    pub term: u64,
    pub last_applied_index: u64,
    pub sessions: usize,
    pub locks: usize,
    pub next_token: Token,
    pub snapshot_index: u64,
    pub purged_index: u64,
}

/// A session whose caller presented its secret (see `secret.rs`): the
/// operations on a session take this rather than a bare id, so that none of
/// them can skip the check. Only [`Node::authorize`] makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedSession(SessionId);

impl OwnedSession {
    pub fn id(self) -> SessionId {
        self.0
    }
}

#[derive(Clone)]
pub struct Node {
    pub(crate) id: NodeId,
    pub(crate) raft: Raft,
    pub(crate) proposer: Proposer,
    pub(crate) table: SharedTable,
    pub(crate) waits: Arc<Waits>,
    /// Acquires whose callers went away, to give up after a grace.
    pub(crate) abandoned: Arc<abandoned::Abandoned>,
    pub(crate) leases: Arc<Leases>,
    pub(crate) metrics: Arc<Metrics>,
    /// Forming a cluster: this node found no formed cluster among its peers
    /// and waits to be taken in (see `cluster::form`).
    pub(crate) ready_to_join: Arc<std::sync::atomic::AtomicBool>,
    /// The node's TLS settings, which its peer connections use too.
    pub(crate) tls: Option<Arc<crate::tls::NodeTls>>,
    /// Without TLS, the cluster secret its peers authenticate with.
    pub(crate) peer_secrets: Option<Arc<crate::auth::peers::PeerSecrets>>,
    /// Embedded in another program, which delivers its peers' messages.
    pub(crate) in_process_peers: bool,
    /// The highest feature level this node supports (`--max-feature-level`).
    pub(crate) feature_level: FeatureLevel,
    /// Each other member's feature level, as this node last asked while
    /// leading (`cluster_version.rs`): an error names whoever holds a
    /// feature back.
    pub(crate) member_levels: Arc<std::sync::Mutex<MemberLevels>>,
    /// Told when this node starts leading, so that a new leader (a fresh
    /// cluster's first one) raises the cluster version at once, not a
    /// round later.
    pub(crate) started_leading: Arc<tokio::sync::Notify>,
    /// The newest entries' events, for watches (`watch.rs`).
    pub(crate) history: Arc<crate::watches::History>,
    /// The log as the node started: reads wait for it after a restart
    /// within a term this node leads (`restart_read.rs`).
    pub(crate) startup_log: Arc<StartupLog>,
    /// Whether the disk is full: writes and linearizable reads are refused
    /// meanwhile (`store/disk_space.rs`).
    pub(crate) space: crate::store::DiskSpace,
}

/// Each member's answer to the leader's latest question about its level.
pub(crate) type MemberLevels = Vec<(NodeId, Result<FeatureLevel, String>)>;

/// How long a read or keepalive waits for a quorum to confirm this node still
/// leads, before answering `unavailable` (e.g. on the minority side of a
/// partition, where it would otherwise wait until the partition heals).
const QUORUM_WAIT: Duration = Duration::from_secs(2);
const QUORUM_RETRY: Duration = Duration::from_millis(50);

/// Default and largest page of `list_locks`.
pub const LIST_PAGE: usize = 1000;

impl Node {
    /// Commits `proposal` and reads its answer; refused as overloaded
    /// when the queue is full and [`Admission::of`] the command allows.
    ///
    /// This and the functions on the call path below return futures rather
    /// than being `async fn`s: an `async fn` keeps its arguments twice (as
    /// given, and as the locals its body moves them into) and a wrapper's
    /// future holds the whole of the future it awaits, so each layer added
    /// to the future every call allocates (see `calls.rs`).
    pub(crate) fn propose<'a, A: 'a>(
        &'a self,
        proposal: Proposal<A>,
    ) -> impl Future<Output = Result<A, ApiError>> + 'a {
        let admission = Admission::of(proposal.command());
        self.propose_with(proposal, admission, Pace::Prompt)
    }

    /// [`propose`](Self::propose), with the caller deciding whether the
    /// command may be refused and whether it may wait for company in the
    /// log. The one place an outcome is read: one of another command (a bug
    /// in the table) is an `internal` error.
    fn propose_with<'a, A: 'a>(
        &'a self,
        proposal: Proposal<A>,
        admission: Admission,
        pace: Pace,
    ) -> impl Future<Output = Result<A, ApiError>> + 'a {
        let (command, answer) = proposal.into_parts();
        // A combinator: an `async` block awaiting a future it was given
        // would keep that future twice. Nothing is queued until it is
        // polled, as with an `async fn`.
        let proposing = self.proposer.propose_with(command, admission, pace);
        proposing.map(move |outcome| {
            answer.read(outcome??).map_err(|wrong| {
                tracing::error!(%wrong, "the state machine answered the wrong outcome");
                ApiError::from(wrong)
            })
        })
    }

    /// Opens a session owned by `owner` (an identity; `None`: anonymous)
    /// and whoever knows the secret `secret` is the hash of.
    pub async fn open_session(
        &self,
        ttl: Duration,
        secret: SecretHash,
        owner: Option<String>,
    ) -> Result<(SessionId, Duration), ApiError> {
        validate_ttl(ttl)?;
        let ttl_ms = ttl.as_millis() as u64;
        let opening = Proposal::open_session(ttl_ms, secret, owner);
        let (session, ttl_ms) = self.propose(opening).await?;
        Ok((session, Duration::from_millis(ttl_ms)))
    }

    /// Checks that `secret` is the secret `session` was opened with. Checked
    /// against this node's applied table, which is sound: ids are never
    /// reused and a session's secret never changes, so a session that is
    /// live here has the same secret on every replica, and one that ended
    /// never comes back. Only an id this node has not seen opened needs the
    /// log: its opening may be committed but not yet applied here (say, on a
    /// new leader), so it is looked up again after a linearizable barrier,
    /// and if it is still not there, no session has that id yet and a call
    /// on it must not reach the log (it could be applied after the opening
    /// of that id by someone else).
    ///
    /// The session must also belong to the caller's `identity`: a secret that
    /// leaked to another identity (a shared log, a copied environment) does
    /// not let that identity act on the session.
    pub async fn authorize(
        &self,
        identity: Option<&str>,
        session: SessionId,
        secret: &str,
    ) -> Result<OwnedSession, ApiError> {
        if let Some(checked) = self.check_secret(identity, session, secret) {
            return checked;
        }
        // Boxed, as in `authenticate`: a session this node has not applied
        // yet is rare, and the barrier's 2 KB would otherwise weigh on
        // every call's future.
        Box::pin(self.linearizable()).await?;
        self.check_secret(identity, session, secret)
            .unwrap_or_else(|| Err(LockError::UnknownSession(session).into()))
    }

    /// [`authorize`](Self::authorize) on the applied table; `None` if the
    /// session has not been opened as far as this node knows.
    fn check_secret(
        &self,
        identity: Option<&str>,
        session: SessionId,
        secret: &str,
    ) -> Option<Result<OwnedSession, ApiError>> {
        let state = self.table.read().expect("state lock poisoned");
        match state.table.session_secret(session) {
            SessionSecret::Live { owner, .. } if owner != identity => {
                let owner = owner.unwrap_or("an anonymous client");
                Some(Err(ApiError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "session {session} belongs to identity {owner:?}; only the identity \
                         that opened a session may use it"
                    ),
                )))
            }
            SessionSecret::Live { secret: hash, .. } if crate::secret::matches(secret, hash) => {
                Some(Ok(OwnedSession(session)))
            }
            SessionSecret::Live { .. } => {
                tracing::debug!(
                    session = session.0,
                    "refused a call without the session's secret"
                );
                let why = if secret.is_empty() {
                    format!(
                        "session {session} needs its secret: send the session_secret that \
                         opening the session returned"
                    )
                } else {
                    format!(
                        "session {session} belongs to another client: the session secret \
                         does not match"
                    )
                };
                Some(Err(ApiError::new(
                    ErrorKind::PermissionDenied,
                    format!("{why} (only the client that opened a session may use it)"),
                )))
            }
            SessionSecret::Ended => Some(Err(LockError::UnknownSession(session).into())),
            SessionSecret::NotYetOpened => None,
        }
    }

    /// Renews a lease. Not written to the log: only the leader's deadline
    /// moves. But the leader must still *be* the leader when it renews: a
    /// deposed leader cut off from the others would otherwise go on renewing
    /// leases that the new leader is free to expire. The barrier below gets a
    /// quorum's acknowledgement of a heartbeat sent after this keepalive
    /// arrived, so any later leader was elected after the renewal and gives
    /// the session a full TTL from its own (later) start.
    pub async fn keep_alive(&self, session: OwnedSession) -> Result<Duration, ApiError> {
        let session = session.id();
        if !self.leases.is_leading() {
            return Err(self.not_leader("this node is not (yet) the leader"));
        }
        // Boxed: the barrier's 2 KB would otherwise size the future of
        // every call on a `Calls` stream (the largest call sets it), where
        // acquires and releases far outnumber keepalives.
        Box::pin(self.linearizable()).await?;
        let renewed = match self.leases.renew(session) {
            Err(KeepAliveError::Checkpointed) => {
                // The log says this lease may be short; say otherwise there
                // before telling the client it was renewed.
                self.propose(Proposal::lease_renewed(session)).await?;
                self.leases.renewed_through_log(session)
            }
            other => other,
        };
        if renewed.is_ok() {
            self.metrics.lease_renewed();
        }
        renewed.map_err(|err| match err {
            KeepAliveError::NotLeader => self.not_leader("this node is not (yet) the leader"),
            KeepAliveError::Unknown => LockError::UnknownSession(session).into(),
            KeepAliveError::Expiring => ApiError::new(
                ErrorKind::SessionExpiring,
                format!("session {session} has expired and is being closed"),
            ),
            KeepAliveError::Checkpointed => unreachable!("renewed through the log"),
        })
    }

    pub async fn close_session(&self, session: OwnedSession) -> Result<(), ApiError> {
        self.propose(Proposal::close_session(session.id())).await
    }

    /// Takes the request's name rather than a copy of it: the command
    /// carries it into the log.
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments twice"
    )]
    pub fn release(
        &self,
        session: OwnedSession,
        lock: String,
        token: Token,
    ) -> impl Future<Output = Result<(), ApiError>> + '_ {
        async move {
            validate_lock_name(&lock)?;
            self.propose(Proposal::release(session.id(), lock, token))
                .await
        }
    }

    /// Waits until this node's state machine reflects every write committed
    /// before the call (a read-index barrier through openraft): proof from a
    /// quorum that this node still leads.
    pub(crate) async fn linearizable(&self) -> Result<(), ApiError> {
        use openraft::error::{CheckIsLeaderError, RaftError};
        if self.space.is_full() {
            // Raft waits for the log append the disk refused: no barrier
            // passes until space is back.
            return Err(crate::proposer::ProposeError::DiskFull.into());
        }
        let give_up = tokio::time::Instant::now() + QUORUM_WAIT;
        loop {
            let barrier = tokio::time::timeout_at(give_up, self.raft.ensure_linearizable());
            let failure = match barrier.await {
                Ok(Ok(_)) => return self.startup_log.applied(&self.raft, give_up).await,
                Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => {
                    return Err(self.not_leader("cannot serve a linearizable read here"))
                }
                // This node is gone for good; another will serve.
                Ok(Err(RaftError::Fatal(fatal))) => {
                    return Err(ApiError::new(
                        ErrorKind::Unavailable,
                        format!("this node stopped ({fatal}); another node will serve"),
                    ))
                }
                // Peers that did not answer this round (one slow, one just
                // reconnecting) may answer the next.
                Ok(Err(RaftError::APIError(err @ CheckIsLeaderError::QuorumNotEnough(_)))) => {
                    err.to_string()
                }
                Err(_) => "no answer".to_owned(),
            };
            if tokio::time::Instant::now() + QUORUM_RETRY >= give_up {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "no quorum confirmed this node's leadership within {QUORUM_WAIT:?} \
                         (it may be cut off from the cluster): {failure}"
                    ),
                ));
            }
            tokio::time::sleep(QUORUM_RETRY).await;
        }
    }

    /// Whether another node leads, as far as this one knows.
    pub(crate) fn leader_elsewhere(&self) -> bool {
        let metrics = self.raft.metrics();
        let leader = metrics.borrow().current_leader;
        leader.is_some_and(|id| id != self.id)
    }

    /// A `not_leader` refusal that names the leader, when this node knows it.
    pub(crate) fn not_leader(&self, what: &str) -> ApiError {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader.filter(|id| *id != self.id);
        let address = leader.and_then(|id| {
            metrics
                .membership_config
                .membership()
                .get_node(&id)
                .map(|node| node.addr.clone())
        });
        let message = match (leader, &address) {
            (Some(id), Some(address)) => format!("{what}; the leader is node {id} at {address}"),
            _ => format!("{what}; no leader is known yet, retry"),
        };
        ApiError {
            leader: address,
            ..ApiError::new(ErrorKind::NotLeader, message)
        }
    }

    /// Reads the table after a linearizable barrier.
    async fn read_linearizable<T>(
        &self,
        read: impl FnOnce(&LockTable) -> T,
    ) -> Result<T, ApiError> {
        Ok(self.read_indexed(read).await?.value)
    }

    /// [`read_linearizable`](Self::read_linearizable), with the log index
    /// of the state it read.
    async fn read_indexed<T>(
        &self,
        read: impl FnOnce(&LockTable) -> T,
    ) -> Result<Indexed<T>, ApiError> {
        self.linearizable().await?;
        let applied = self.table.read().expect("state lock poisoned");
        Ok(Indexed {
            value: read(&applied.table),
            index: applied.last_applied.map_or(0, |id| id.index),
        })
    }

    pub async fn lock_status(&self, lock: &str) -> Result<Indexed<Option<LockInfo>>, ApiError> {
        validate_lock_name(lock)?;
        self.read_indexed(|table| table.lock_or_rw(lock)).await
    }

    /// Who holds and waits on the semaphore `semaphore`. Linearizable.
    pub async fn semaphore_status(
        &self,
        semaphore: &str,
    ) -> Result<Indexed<Option<deadbolt_core::SemaphoreInfo>>, ApiError> {
        validate_lock_name(semaphore)?;
        self.read_indexed(|table| table.semaphores().semaphore(semaphore))
            .await
    }

    /// Creates the semaphore `semaphore` with `capacity` permits, or gives
    /// the one that exists that capacity (`delete`: drops its definition);
    /// then its state.
    pub async fn define_semaphore(
        &self,
        semaphore: &str,
        capacity: Option<u32>,
    ) -> Result<Indexed<Option<deadbolt_core::SemaphoreInfo>>, ApiError> {
        validate_lock_name(semaphore)?;
        self.check_cluster_version_allows(FeatureLevel::SEMAPHORES, "semaphores")?;
        let proposal = match capacity {
            Some(capacity) => Proposal::define_semaphore(semaphore.to_owned(), capacity),
            None => Proposal::delete_semaphore(semaphore.to_owned()),
        };
        self.propose(proposal).await?;
        self.semaphore_status(semaphore).await
    }

    /// The leader of `election` proclaims `value`, with its term's token.
    pub async fn proclaim(
        &self,
        session: OwnedSession,
        election: &str,
        term: Token,
        value: String,
    ) -> Result<(), ApiError> {
        validate_lock_name(election)?;
        self.check_cluster_version_allows(FeatureLevel::ELECTIONS, "elections")?;
        let proposal = Proposal::proclaim(session.id(), election.to_owned(), term, value);
        self.propose(proposal).await
    }

    /// The leader and candidates of `election`. Linearizable.
    pub async fn election(
        &self,
        election: &str,
    ) -> Result<Indexed<Option<deadbolt_core::ElectionInfo>>, ApiError> {
        validate_lock_name(election)?;
        self.read_indexed(|table| table.semaphores().election(election))
            .await
    }

    /// Up to `limit` locks after `after` in name order, and whether more follow.
    pub async fn list_locks(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Indexed<(Vec<LockInfo>, bool)>, ApiError> {
        let limit = if limit == 0 {
            LIST_PAGE
        } else {
            limit.min(LIST_PAGE)
        };
        let Indexed {
            value: mut locks,
            index,
        } = self
            .read_indexed(|table| {
                let page = table.locks_and_rw_after(after).take(limit + 1);
                page.collect::<Vec<LockInfo>>()
            })
            .await?;
        let more = locks.len() > limit;
        locks.truncate(limit);
        Ok(Indexed {
            value: (locks, more),
            index,
        })
    }

    /// The kept audit trail of `lock`, oldest first.
    pub async fn lock_history(&self, lock: &str) -> Result<Vec<AuditRecord>, ApiError> {
        validate_lock_name(lock)?;
        self.read_linearizable(|table| table.history(lock)).await
    }

    /// Whether `token` is the current grant of `lock`, and the current
    /// grant's token if the lock is held. Of a semaphore, whether `token`
    /// is one of its live permits, and the newest of them.
    pub async fn check_token(
        &self,
        lock: &str,
        token: Token,
    ) -> Result<(bool, Option<Token>), ApiError> {
        validate_lock_name(lock)?;
        self.read_linearizable(|table| {
            let semaphores = table.semaphores();
            if semaphores.contains(lock) {
                let newest = semaphores.newest_permit(lock);
                return (semaphores.holds_permit(lock, token), newest);
            }
            // A lock in lock-delay has no current grant: its holder expired.
            let current = table
                .lock(lock)
                .filter(|info| !info.delayed)
                .map(|info| info.token);
            (current == Some(token), current)
        })
        .await
    }

    /// A fenced-store change (put, fenced read, delete), through the log.
    pub async fn store_change<A>(&self, change: Proposal<A>) -> Result<A, ApiError> {
        debug_assert!(matches!(
            change.command(),
            Command::StorePut { .. } | Command::StoreRead { .. } | Command::StoreDelete { .. }
        ));
        self.propose(change).await
    }

    /// Milliseconds since the Unix epoch, on this node's wall clock: when a
    /// credential made now with a time to live ends.
    pub fn unix_ms(&self) -> u64 {
        self.leases.clock().unix_ms()
    }

    /// Changes who may do what, through the log like everything else.
    pub async fn change_acl(&self, change: AclCommand) -> Result<(), ApiError> {
        let needs = change.needs();
        self.check_cluster_version_allows(needs, "expiring tokens and denied identities")?;
        self.propose(Proposal::acl(change)).await
    }

    /// The access-control rules as this node has applied them, read after a
    /// linearizable barrier so a change just made shows.
    pub async fn acl(&self) -> Result<AccessControl, ApiError> {
        self.read_linearizable(|table| table.acl().clone()).await
    }

    /// A plain (unfenced) linearizable read of a fenced-store key.
    pub async fn store_get(&self, key: &str) -> Result<Option<StoredValue>, ApiError> {
        validate_key(key)?;
        self.read_linearizable(|table| table.store().get(key)).await
    }

    /// The Prometheus scrape (see `metrics.rs`).
    pub fn metrics_text(&self) -> String {
        let queued = self.proposer.queued_commands();
        (self.metrics).render(&self.raft, &self.table, queued, &self.history)
    }

    pub fn health(&self) -> Health {
        let metrics = self.raft.metrics().borrow().clone();
        let applied = self.table.read().expect("state lock poisoned");
        Health {
            node_id: self.id,
            // A leader whose disk is full serves no write, and is on its
            // way out: its Raft waits for the append the disk refused.
            leader: self.leases.is_leading() && !self.space.is_full(),
            term: metrics.current_term,
            last_applied_index: metrics.last_applied.map_or(0, |id| id.index),
            sessions: applied.table.session_count(),
            locks: applied.table.lock_count(),
            next_token: applied.table.next_token(),
            snapshot_index: metrics.snapshot.map_or(0, |id| id.index),
            purged_index: metrics.purged.map_or(0, |id| id.index),
        }
    }
}
