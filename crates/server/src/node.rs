//! [`Node`]: the lock service's operations, independent of the wire.
//!
//! The gRPC and HTTP front ends both call these methods and only translate
//! requests and [`ApiError`]s. Every change goes through the [`Proposer`]
//! (Raft); reads that decide anything pass a linearizable barrier first.

use crate::auth::Caller;
use crate::leases::{KeepAliveError, Leases};
use crate::metrics::Metrics;
use crate::proposer::{Admission, ProposeError, Proposer};
use crate::raft_types::{BatchOutcome, NodeId, Raft};
use crate::store::{EventSink, SharedTable};
use crate::waits::{Subscription, WaitEnd, Waits};
use deadbolt_core::{
    validate_key, validate_lock_name, validate_ttl, AccessControl, AclCommand, AclError,
    AcquireOutcome, AuditRecord, Command, Event, LockError, LockInfo, LockTable, Outcome,
    SecretHash, SessionId, SessionSecret, StoredValue, Token,
};
use deadbolt_proto::ErrorKind;
use std::sync::Arc;
use std::time::Duration;

/// A refused or failed API call: a stable kind and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// With `not_leader`: the leader's address, when this node knows it.
    pub leader: Option<String>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            leader: None,
        }
    }
}

impl From<LockError> for ApiError {
    fn from(err: LockError) -> Self {
        let kind = match err {
            LockError::UnknownSession(_) => ErrorKind::UnknownSession,
            LockError::Busy { .. } => ErrorKind::Busy,
            LockError::NotHolder { .. } => ErrorKind::NotHolder,
            LockError::StaleToken { .. } => ErrorKind::StaleToken,
            LockError::InvalidName { .. } | LockError::TtlOutOfRange { .. } => {
                ErrorKind::InvalidArgument
            }
            LockError::StaleFence { .. } | LockError::NotCurrentGrant { .. } => {
                ErrorKind::StaleToken
            }
            LockError::TokenNotIssued { .. }
            | LockError::LockDelayTooLong { .. }
            | LockError::InvalidKey { .. }
            | LockError::ValueTooLarge { .. }
            | LockError::LimitOutOfRange { .. } => ErrorKind::InvalidArgument,
            // Only the leader's own timer commands are ever superseded.
            LockError::Superseded { .. } => ErrorKind::Unavailable,
            LockError::Acl(AclError::AlreadyBootstrapped) => ErrorKind::PermissionDenied,
            LockError::Acl(AclError::TooMany { .. }) => ErrorKind::LimitReached,
            LockError::Acl(_) => ErrorKind::InvalidArgument,
            LockError::TooManyWaiters { .. }
            | LockError::TooManySessions { .. }
            | LockError::TooManyLocks { .. }
            | LockError::TooManyKeys { .. }
            | LockError::StoreFull { .. } => ErrorKind::LimitReached,
        };
        ApiError::new(kind, err.to_string())
    }
}

impl From<ProposeError> for ApiError {
    fn from(err: ProposeError) -> Self {
        let kind = match err {
            ProposeError::NotLeader { .. } => ErrorKind::NotLeader,
            ProposeError::ShuttingDown | ProposeError::NoQuorum(_) => ErrorKind::Unavailable,
            ProposeError::Overloaded { .. } => ErrorKind::Overloaded,
            ProposeError::Fatal(_) => ErrorKind::Internal,
        };
        let leader = match &err {
            ProposeError::NotLeader { leader } => leader.clone(),
            _ => None,
        };
        ApiError {
            leader,
            ..ApiError::new(kind, err.to_string())
        }
    }
}

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

/// Wakes waiters, tracks leases and counts, as the state machine applies
/// commands.
pub(crate) struct Observers {
    pub waits: Arc<Waits>,
    pub leases: Arc<Leases>,
    pub metrics: Arc<Metrics>,
}

impl EventSink for Observers {
    fn on_applied(&self, outcomes: &[BatchOutcome], events: &[Event]) {
        self.metrics.applied(outcomes, events);
    }

    fn on_snapshot_built(&self, bytes: usize, took: Duration) {
        self.metrics.snapshot_built(bytes, took);
    }

    fn on_events(&self, events: Vec<Event>) {
        for event in &events {
            self.waits.on_event(event);
            match event {
                Event::SessionOpened { session, ttl_ms } => {
                    self.leases.opened(*session, Duration::from_millis(*ttl_ms))
                }
                Event::SessionEnded { session, .. } => self.leases.ended(*session),
                Event::LockDelayed {
                    lock,
                    token,
                    delay_ms,
                } => self
                    .leases
                    .lock_delayed(lock, *token, Duration::from_millis(*delay_ms)),
                _ => {}
            }
        }
    }

    fn on_reset(&self, table: &LockTable) {
        self.waits.reset(table);
    }
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
    pub(crate) leases: Arc<Leases>,
    pub(crate) metrics: Arc<Metrics>,
    /// Forming a cluster: this node found no formed cluster among its peers
    /// and waits to be taken in (see `cluster::form`).
    pub(crate) ready_to_join: Arc<std::sync::atomic::AtomicBool>,
    /// The node's TLS settings, which its peer connections use too.
    pub(crate) tls: Option<Arc<crate::tls::NodeTls>>,
}

/// How long a read or keepalive waits for a quorum to confirm this node still
/// leads, before answering `unavailable` (e.g. on the minority side of a
/// partition, where it would otherwise wait until the partition heals).
const QUORUM_WAIT: Duration = Duration::from_secs(2);
const QUORUM_RETRY: Duration = Duration::from_millis(50);

/// Default and largest page of `list_locks`.
pub const LIST_PAGE: usize = 1000;

impl Node {
    /// Called when this node starts leading. The callers of the queued waits
    /// were connected to the old leader, or to this node before it
    /// restarted, and every one of them lost its call: each wait gets the
    /// grace of any acquire whose caller went away, so that the places of
    /// callers that do not come back are given up instead of being granted
    /// to sessions nobody waits in. Only the queue place: a grant made
    /// meanwhile may already be known to its caller (through a retry that
    /// reused its attempt id), and stays.
    pub fn give_up_unclaimed_waits(&self) {
        let queued: Vec<(SessionId, String)> = {
            let state = self.table.read().expect("state lock poisoned");
            state
                .table
                .waits()
                .map(|(session, lock)| (session, lock.to_owned()))
                .collect()
        };
        for (session, lock) in queued {
            tokio::spawn(abandon_unless_claimed(
                self.clone(),
                session,
                lock,
                Claim::QueuePlace,
            ));
        }
    }

    async fn propose(&self, command: Command) -> Result<Outcome, ApiError> {
        Ok(self.proposer.propose(command).await??)
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
        match self
            .propose(Command::OpenSession {
                ttl_ms,
                secret,
                owner,
            })
            .await?
        {
            Outcome::SessionOpened { session, ttl_ms } => {
                Ok((session, Duration::from_millis(ttl_ms)))
            }
            other => unreachable!("open session answered {other:?}"),
        }
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
    /// The session must also belong to `caller`'s identity: a secret that
    /// leaked to another identity (a shared log, a copied environment) does
    /// not let that identity act on the session.
    pub async fn authorize(
        &self,
        caller: &Caller,
        session: SessionId,
        secret: &str,
    ) -> Result<OwnedSession, ApiError> {
        if let Some(checked) = self.check_secret(caller, session, secret) {
            return checked;
        }
        self.linearizable().await?;
        self.check_secret(caller, session, secret)
            .unwrap_or_else(|| Err(LockError::UnknownSession(session).into()))
    }

    /// [`authorize`](Self::authorize) on the applied table; `None` if the
    /// session has not been opened as far as this node knows.
    fn check_secret(
        &self,
        caller: &Caller,
        session: SessionId,
        secret: &str,
    ) -> Option<Result<OwnedSession, ApiError>> {
        let state = self.table.read().expect("state lock poisoned");
        match state.table.session_secret(session) {
            SessionSecret::Live { owner, .. } if owner != caller.identity() => {
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
        self.linearizable().await?;
        let renewed = match self.leases.renew(session) {
            Err(KeepAliveError::Checkpointed) => {
                // The log says this lease may be short; say otherwise there
                // before telling the client it was renewed.
                self.propose(Command::LeaseRenewed { session }).await?;
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
        self.propose(Command::CloseSession {
            session: session.id(),
        })
        .await?;
        Ok(())
    }

    /// Takes `lock`. With `wait`, blocks until granted or until `timeout`
    /// passes. If the returned future is dropped first (the caller went
    /// away), the wait or grant is abandoned after a grace period, unless a
    /// retry of the acquire has come since (see [`AcquireCall`]).
    pub async fn acquire(
        &self,
        session: OwnedSession,
        lock: &str,
        wait: bool,
        timeout: Option<Duration>,
        attempt: u64,
        lock_delay: Duration,
    ) -> Result<Token, ApiError> {
        validate_lock_name(lock)?;
        let mut call = AcquireCall {
            node: self.clone(),
            session: session.id(),
            lock: lock.to_owned(),
            attempt,
            lock_delay_ms: u64::try_from(lock_delay.as_millis()).unwrap_or(u64::MAX),
            subscription: None,
            answered: false,
        };
        let answer = call.run(wait, timeout).await;
        // An outage answer leaves the request's effect unknown to the caller,
        // who may never retry: treat it like a caller that went away. (A
        // `not_leader` answer means the acquire never reached the log: there
        // is nothing to give back.)
        call.answered = !answer
            .as_ref()
            .is_err_and(|err| matches!(err.kind, ErrorKind::Unavailable | ErrorKind::Internal));
        answer
    }

    /// Leaves the queue of `lock`; returns the token if the grant came first.
    async fn cancel_wait(&self, session: SessionId, lock: &str) -> Result<Option<Token>, ApiError> {
        match self
            .propose(Command::CancelWait {
                session,
                lock: lock.to_owned(),
            })
            .await?
        {
            Outcome::WaitCancelled { granted } => Ok(granted),
            other => unreachable!("cancel wait answered {other:?}"),
        }
    }

    pub async fn release(
        &self,
        session: OwnedSession,
        lock: &str,
        token: Token,
    ) -> Result<(), ApiError> {
        validate_lock_name(lock)?;
        self.propose(Command::Release {
            session: session.id(),
            lock: lock.to_owned(),
            token,
        })
        .await?;
        Ok(())
    }

    /// Waits until this node's state machine reflects every write committed
    /// before the call (a read-index barrier through openraft): proof from a
    /// quorum that this node still leads.
    pub(crate) async fn linearizable(&self) -> Result<(), ApiError> {
        use openraft::error::{CheckIsLeaderError, RaftError};
        let give_up = tokio::time::Instant::now() + QUORUM_WAIT;
        loop {
            let barrier = tokio::time::timeout_at(give_up, self.raft.ensure_linearizable());
            let failure = match barrier.await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => {
                    return Err(self.not_leader("cannot serve a linearizable read here"))
                }
                Ok(Err(RaftError::Fatal(fatal))) => {
                    return Err(ApiError::new(
                        ErrorKind::Internal,
                        format!("raft has stopped: {fatal}"),
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
        self.linearizable().await?;
        Ok(read(&self.table.read().expect("state lock poisoned").table))
    }

    pub async fn lock_status(&self, lock: &str) -> Result<Option<LockInfo>, ApiError> {
        validate_lock_name(lock)?;
        self.read_linearizable(|table| table.lock(lock)).await
    }

    /// Up to `limit` locks after `after` in name order, and whether more follow.
    pub async fn list_locks(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<(Vec<LockInfo>, bool), ApiError> {
        let limit = if limit == 0 {
            LIST_PAGE
        } else {
            limit.min(LIST_PAGE)
        };
        let mut locks: Vec<LockInfo> = self
            .read_linearizable(|table| table.locks_after(after).take(limit + 1).collect())
            .await?;
        let more = locks.len() > limit;
        locks.truncate(limit);
        Ok((locks, more))
    }

    /// The kept audit trail of `lock`, oldest first.
    pub async fn lock_history(&self, lock: &str) -> Result<Vec<AuditRecord>, ApiError> {
        validate_lock_name(lock)?;
        self.read_linearizable(|table| table.history(lock)).await
    }

    /// Whether `token` is the current grant of `lock`, and the current
    /// grant's token if the lock is held.
    pub async fn check_token(
        &self,
        lock: &str,
        token: Token,
    ) -> Result<(bool, Option<Token>), ApiError> {
        // A lock in lock-delay has no current grant: its holder expired.
        let current = self
            .lock_status(lock)
            .await?
            .filter(|info| !info.delayed)
            .map(|info| info.token);
        Ok((current == Some(token), current))
    }

    /// A fenced-store change (put, fenced read, delete), through the log.
    pub async fn store_change(&self, command: Command) -> Result<Outcome, ApiError> {
        debug_assert!(matches!(
            command,
            Command::StorePut { .. } | Command::StoreRead { .. } | Command::StoreDelete { .. }
        ));
        self.propose(command).await
    }

    /// Changes who may do what, through the log like everything else.
    pub async fn change_acl(&self, change: AclCommand) -> Result<(), ApiError> {
        match self.propose(Command::Acl(change)).await? {
            Outcome::AclChanged => Ok(()),
            other => unreachable!("an access-control change answered {other:?}"),
        }
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
        (self.metrics).render(&self.raft, &self.table, self.proposer.queued_commands())
    }

    pub fn health(&self) -> Health {
        let metrics = self.raft.metrics().borrow().clone();
        let applied = self.table.read().expect("state lock poisoned");
        Health {
            node_id: self.id,
            leader: self.leases.is_leading(),
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

/// One acquire request in progress. Dropped before it has an answer (the
/// client disconnected or gave up), it hands its wait or grant back.
struct AcquireCall {
    node: Node,
    session: SessionId,
    lock: String,
    attempt: u64,
    lock_delay_ms: u64,
    subscription: Option<Subscription>,
    answered: bool,
}

impl AcquireCall {
    async fn run(&mut self, wait: bool, timeout: Option<Duration>) -> Result<Token, ApiError> {
        let command = Command::Acquire {
            session: self.session,
            lock: self.lock.clone(),
            wait,
            attempt: self.attempt,
            lock_delay_ms: self.lock_delay_ms,
        };
        // A retry of an acquire that already has its queue place (or grant)
        // is never refused as overloaded: refused for longer than the
        // abandonment grace, it would lose that place.
        let retry = (self.node.table.read().expect("state lock poisoned").table)
            .holds_or_waits(self.session, &self.lock);
        let admission = match retry {
            true => Admission::Always,
            false => Admission::Refusable,
        };
        let proposed = self.node.proposer.propose_with(command, admission).await;
        match proposed?? {
            Outcome::Acquire(AcquireOutcome::Granted { token }) => Ok(token),
            Outcome::Acquire(AcquireOutcome::Queued { .. }) => {
                self.subscription = Some(self.node.waits.subscribe(self.session, &self.lock));
                self.wait(timeout).await
            }
            other => unreachable!("acquire answered {other:?}"),
        }
    }

    async fn wait(&mut self, timeout: Option<Duration>) -> Result<Token, ApiError> {
        let started = std::time::Instant::now();
        let answer = self.wait_for_grant(timeout).await;
        self.node
            .metrics
            .acquire_waited(started.elapsed(), answer.is_ok());
        answer
    }

    async fn wait_for_grant(&mut self, timeout: Option<Duration>) -> Result<Token, ApiError> {
        let subscription = self.subscription.as_mut().expect("subscribed");
        let ended = match timeout {
            Some(limit) => tokio::time::timeout(limit, &mut subscription.ended)
                .await
                .ok(),
            None => Some((&mut subscription.ended).await),
        };
        let subscription = self.subscription.take().expect("subscribed");
        let others_waiting = self.node.waits.unsubscribe(&subscription);
        match ended {
            Some(Ok(WaitEnd::Granted(token))) => Ok(token),
            Some(Ok(WaitEnd::Dropped)) | Some(Err(_)) => Err(self.ended_without_grant()),
            None if others_waiting => Err(timed_out(&self.lock)),
            // The wait is in the log; a cancel that does not get there leaves
            // it unknown to the caller whether it is still queued.
            None => match self
                .node
                .cancel_wait(self.session, &self.lock)
                .await
                .map_err(not_leader_is_unavailable)?
            {
                // The grant won the race with the timeout: it stands.
                Some(token) => Ok(token),
                None => Err(timed_out(&self.lock)),
            },
        }
    }

    /// Why a wait ended without a grant, as the caller should hear it.
    fn ended_without_grant(&self) -> ApiError {
        let session_alive = self
            .node
            .table
            .read()
            .expect("state lock poisoned")
            .table
            .has_session(self.session);
        if !session_alive {
            return ApiError::new(
                ErrorKind::UnknownSession,
                format!(
                    "unknown session {}: it ended (closed or expired) while waiting for lock {:?}",
                    self.session, self.lock
                ),
            );
        }
        if self.node.waits.is_closed() || !self.node.leases.is_leading() {
            return ApiError::new(
                ErrorKind::Unavailable,
                "this node stopped leading or is shutting down; retry the acquire to keep the queue place",
            );
        }
        ApiError::new(
            ErrorKind::WaitCancelled,
            format!("the wait for lock {:?} was cancelled", self.lock),
        )
    }
}

/// A `not_leader` refusal of a follow-up command, after the request already
/// changed something: for the caller, the outcome is unknown.
fn not_leader_is_unavailable(err: ApiError) -> ApiError {
    if err.kind == ErrorKind::NotLeader {
        ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "leadership changed while the request was in progress: {}",
                err.message
            ),
        )
    } else {
        err
    }
}

fn timed_out(lock: &str) -> ApiError {
    ApiError::new(
        ErrorKind::WaitTimeout,
        format!("timed out waiting for lock {lock:?}"),
    )
}

/// How long an abandoned acquire keeps its queue place (or grant). A client
/// whose connection dropped retries within this time (its backoff is capped
/// at 1s) and finds its place, instead of being sent to the back of the queue.
const ABANDON_GRACE: Duration = Duration::from_secs(3);

impl Drop for AcquireCall {
    fn drop(&mut self) {
        if let Some(subscription) = self.subscription.take() {
            self.node.waits.unsubscribe(&subscription);
        }
        if self.answered {
            return;
        }
        let lock = std::mem::take(&mut self.lock);
        // With an attempt id the state machine knows whether a later
        // acquire took over, and can release a grant nobody received.
        // Without one, only the queue place can safely be given up.
        let claim = match self.attempt {
            0 => Claim::QueuePlace,
            attempt => Claim::Attempt(attempt),
        };
        tokio::spawn(abandon_unless_claimed(
            self.node.clone(),
            self.session,
            lock,
            claim,
        ));
    }
}

/// What of an acquire whose caller went away may be given up.
enum Claim {
    /// The queue place, or a grant no later attempt took over.
    Attempt(u64),
    /// Only the queue place.
    QueuePlace,
}

/// Gives up `session`'s `claim` on `lock` after [`ABANDON_GRACE`], unless an
/// acquire call watches the wait again by then: its caller went away.
async fn abandon_unless_claimed(node: Node, session: SessionId, lock: String, claim: Claim) {
    tokio::time::sleep(ABANDON_GRACE).await;
    if node.waits.is_watched(session, &lock) {
        return;
    }
    let command = match claim {
        Claim::Attempt(attempt) => Command::Abandon {
            session,
            lock: lock.clone(),
            attempt,
        },
        Claim::QueuePlace => Command::CancelWait {
            session,
            lock: lock.clone(),
        },
    };
    match node.propose(command).await {
        Ok(Outcome::Abandoned {
            released: Some(token),
        }) => {
            tracing::info!(
                session = session.0,
                lock,
                token = token.0,
                "released a grant whose requester went away"
            )
        }
        Ok(_) => {}
        Err(err) => {
            tracing::debug!(session = session.0, lock, message = %err.message, "abandoned acquire not cleaned up")
        }
    }
}
