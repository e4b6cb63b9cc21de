//! The acquire call, and the giving up of what its caller never learned of.
//!
//! Why a module of its own: an acquire is the one operation that outlives
//! its request. It may wait in a queue, and when its caller goes away (a
//! dropped connection, a cancelled `Calls` entry, an outage answer, or a
//! new leader whose queued waiters were connected elsewhere), what it
//! holds, a queue place or a grant nobody received, must be given back, but
//! only after a grace period in which a retry can claim it. [`AcquireCall`]
//! is the guard whose drop starts that: it queues an [`Abandonment`] that
//! [`give_up_abandoned`], one task for the whole node, proposes once the
//! grace is over: `Abandon` (with the attempt id, so the state machine keeps
//! a grant a later retry already has) or `CancelWait` (only the queue place).

use super::abandoned::{Abandonment, Claim};
use super::error::ApiError;
use super::{Node, OwnedSession};
use crate::proposer::{Admission, Pace, BACKGROUND_PROPOSALS_IN_FLIGHT};
use crate::waits::{Subscription, WaitEnd};
use deadbolt_core::{
    validate_lock_name, AcquireOutcome, FeatureLevel, Permit, Proposal, RwMode, SessionId, Token,
};
use deadbolt_proto::ErrorKind;
use futures::StreamExt;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

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
            self.abandoned.push(session, lock, Claim::QueuePlace);
        }
    }

    /// Takes `lock`. With `wait`, blocks until granted or until `timeout`
    /// passes. If the returned future is dropped first (the caller went
    /// away), the wait or grant is abandoned after a grace period, unless a
    /// retry of the acquire has come since (see [`AcquireCall`]).
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments twice"
    )]
    pub fn acquire<'a>(
        &'a self,
        session: OwnedSession,
        lock: &'a str,
        wait: bool,
        timeout: Option<Duration>,
        attempt: u64,
        lock_delay: Duration,
    ) -> impl Future<Output = Result<Token, ApiError>> + 'a {
        // Not an `async fn`, which would keep its arguments twice in the
        // future every call allocates (see `Node::propose`).
        async move {
            validate_lock_name(lock)?;
            let lock_delay_ms = u64::try_from(lock_delay.as_millis()).unwrap_or(u64::MAX);
            let asked = Asked::Lock { lock_delay_ms };
            (self.acquire_as(session, lock, asked, wait, timeout, attempt)).await
        }
    }

    /// Takes `count` permits of the semaphore `semaphore` (created with
    /// `capacity` permits if unused), as [`acquire`](Self::acquire) takes a
    /// lock; answers the permits. Refused with `needs_upgrade` until the
    /// cluster version allows semaphores: a member on an older release
    /// could not apply the command.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_permits(
        &self,
        session: OwnedSession,
        semaphore: &str,
        capacity: u32,
        count: u32,
        wait: bool,
        timeout: Option<Duration>,
        attempt: u64,
    ) -> Result<Vec<Permit>, ApiError> {
        validate_lock_name(semaphore)?;
        self.check_cluster_version_allows(FeatureLevel::SEMAPHORES, "semaphores")?;
        let id = session.id();
        let asked = Asked::Permits { capacity, count };
        self.acquire_as(session, semaphore, asked, wait, timeout, attempt)
            .await?;
        let state = self.table.read().expect("state lock poisoned");
        match state.table.semaphores().permits(id, semaphore) {
            Some(permits) => Ok(permits.to_vec()),
            // Granted, then gone with the session before this read.
            None => Err(ApiError::new(
                ErrorKind::UnknownSession,
                format!("unknown session {id}: it ended right after its permits of {semaphore:?} were granted"),
            )),
        }
    }

    /// Takes the read/write lock `lock` in `mode`, as
    /// [`acquire`](Self::acquire) takes a lock. Refused with
    /// `needs_upgrade` until the cluster version allows read/write locks.
    pub async fn acquire_rw(
        &self,
        session: OwnedSession,
        lock: &str,
        mode: RwMode,
        wait: bool,
        timeout: Option<Duration>,
        attempt: u64,
    ) -> Result<Token, ApiError> {
        validate_lock_name(lock)?;
        self.check_cluster_version_allows(FeatureLevel::RW_LOCKS, "read/write locks")?;
        let asked = Asked::Rw { mode };
        self.acquire_as(session, lock, asked, wait, timeout, attempt)
            .await
    }

    /// Runs for leader of `election` with `value`, as
    /// [`acquire`](Self::acquire) takes a lock; answers the term. Refused
    /// with `needs_upgrade` until the cluster version allows elections.
    pub async fn campaign(
        &self,
        session: OwnedSession,
        election: &str,
        value: String,
        wait: bool,
        timeout: Option<Duration>,
        attempt: u64,
    ) -> Result<Token, ApiError> {
        validate_lock_name(election)?;
        self.check_cluster_version_allows(FeatureLevel::ELECTIONS, "elections")?;
        let asked = Asked::Campaign { value };
        self.acquire_as(session, election, asked, wait, timeout, attempt)
            .await
    }

    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments twice"
    )]
    fn acquire_as<'a>(
        &'a self,
        session: OwnedSession,
        name: &'a str,
        asked: Asked,
        wait: bool,
        timeout: Option<Duration>,
        attempt: u64,
    ) -> impl Future<Output = Result<Token, ApiError>> + 'a {
        // Made when first polled, as in an `async fn`: dropped unpolled,
        // the call would be given up.
        async move {
            let mut call = AcquireCall {
                node: self,
                session: session.id(),
                lock: name,
                attempt,
                asked,
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
    }

    /// Leaves the queue of `lock`; returns the token if the grant came first.
    async fn cancel_wait(&self, session: SessionId, lock: &str) -> Result<Option<Token>, ApiError> {
        self.propose(Proposal::cancel_wait(session, lock.to_owned()))
            .await
    }
}

/// What an acquire asks for: a lock, or permits of a semaphore. Both wait,
/// time out and are given up alike, by name.
#[derive(Clone)]
enum Asked {
    Lock { lock_delay_ms: u64 },
    Permits { capacity: u32, count: u32 },
    Rw { mode: RwMode },
    Campaign { value: String },
}

impl Asked {
    /// The name's kind, as messages call it.
    fn kind(&self) -> &'static str {
        match self {
            Asked::Lock { .. } => "lock",
            Asked::Permits { .. } => "semaphore",
            Asked::Rw { .. } => "read/write lock",
            Asked::Campaign { .. } => "election",
        }
    }
}

/// One acquire request in progress. Dropped before it has an answer (the
/// client disconnected or gave up), it hands its wait or grant back.
///
/// It borrows the node and the name from its caller: a clone of each per
/// acquire (a dozen reference counts, and an allocation) showed in the
/// profile of 256 clients (bench/results/2026-12-05.md).
struct AcquireCall<'a> {
    node: &'a Node,
    session: SessionId,
    /// The lock's or the semaphore's name.
    lock: &'a str,
    attempt: u64,
    asked: Asked,
    subscription: Option<Subscription>,
    answered: bool,
}

impl AcquireCall<'_> {
    async fn run(&mut self, wait: bool, timeout: Option<Duration>) -> Result<Token, ApiError> {
        let (session, name, attempt) = (self.session, self.lock.to_owned(), self.attempt);
        let proposal = match self.asked.clone() {
            Asked::Lock { lock_delay_ms } => {
                Proposal::acquire(session, name, wait, attempt, lock_delay_ms)
            }
            Asked::Permits { capacity, count } => {
                Proposal::acquire_permits(session, name, capacity, count, wait, attempt)
            }
            Asked::Rw { mode } => Proposal::acquire_rw(session, name, mode, wait, attempt),
            Asked::Campaign { value } => Proposal::campaign(session, name, value, wait, attempt),
        };
        // A retry of an acquire that already has its queue place (or grant)
        // is never refused as overloaded: refused for longer than the
        // abandonment grace, it would lose that place. One that will only
        // join the queue may share the next command's log append.
        let (retry, queues) = {
            let table = &self.node.table.read().expect("state lock poisoned").table;
            let would_queue = match &self.asked {
                Asked::Lock { .. } => table.acquire_would_queue(self.session, self.lock),
                Asked::Permits { count, .. } => {
                    table.permits_would_queue(self.session, self.lock, *count)
                }
                Asked::Rw { mode } => table.rw_would_queue(self.session, self.lock, *mode),
                Asked::Campaign { .. } => table.campaign_would_queue(self.session, self.lock),
            };
            (
                table.holds_or_waits(self.session, self.lock),
                wait && would_queue,
            )
        };
        let admission = match retry {
            true => Admission::Always,
            false => Admission::Refusable,
        };
        let pace = match queues {
            true => Pace::Patient,
            false => Pace::Prompt,
        };
        match self.node.propose_with(proposal, admission, pace).await? {
            AcquireOutcome::Granted { token } => Ok(token),
            AcquireOutcome::Queued { .. } => {
                self.subscription = Some(self.node.waits.subscribe(self.session, self.lock));
                // Boxed: the wait's future (a timeout, and a cancel through
                // the log) would otherwise make every acquire's future as
                // large, granted at once or not (`calls.rs` boxes each call).
                Box::pin(self.wait(timeout)).await
            }
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
            None if others_waiting => Err(self.timed_out()),
            // The wait is in the log; a cancel that does not get there leaves
            // it unknown to the caller whether it is still queued.
            None => match self
                .node
                .cancel_wait(self.session, self.lock)
                .await
                .map_err(not_leader_is_unavailable)?
            {
                // The grant won the race with the timeout: it stands.
                Some(token) => Ok(token),
                None => Err(self.timed_out()),
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
        let why = match self.asked {
            Asked::Permits { count, .. } => format!(
                " (or an admin lowered the semaphore below the {count} permits it asked for)"
            ),
            _ => String::new(),
        };
        ApiError::new(
            ErrorKind::WaitCancelled,
            format!(
                "the wait for {} {:?} was cancelled{why}",
                self.asked.kind(),
                self.lock
            ),
        )
    }

    fn timed_out(&self) -> ApiError {
        ApiError::new(
            ErrorKind::WaitTimeout,
            format!(
                "timed out waiting for {} {:?}",
                self.asked.kind(),
                self.lock
            ),
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

impl Drop for AcquireCall<'_> {
    fn drop(&mut self) {
        if let Some(subscription) = self.subscription.take() {
            self.node.waits.unsubscribe(&subscription);
        }
        if self.answered {
            return;
        }
        let lock = self.lock.to_owned();
        // With an attempt id the state machine knows whether a later
        // acquire took over, and can release a grant nobody received.
        // Without one, only the queue place can safely be given up.
        let claim = match self.attempt {
            0 => Claim::QueuePlace,
            attempt => Claim::Attempt(attempt),
        };
        self.node.abandoned.push(self.session, lock, claim);
    }
}

/// Gives up the node's abandoned acquires as their grace ends, at most
/// [`BACKGROUND_PROPOSALS_IN_FLIGHT`] at a time, until `stopped`.
pub(crate) async fn give_up_abandoned(node: Node, mut stopped: watch::Receiver<bool>) {
    loop {
        let (due, next) = node.abandoned.take_due(Instant::now());
        let giving_up = futures::stream::iter(due)
            .for_each_concurrent(BACKGROUND_PROPOSALS_IN_FLIGHT, |abandonment| {
                give_up_unless_claimed(&node, abandonment)
            });
        tokio::select! {
            // Biased: the deterministic simulation needs one order.
            biased;
            _ = stopped.changed() => return,
            () = giving_up => {}
        }
        let next_due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = stopped.changed() => return,
            () = next_due => {}
            () = node.abandoned.pushed.notified() => {}
        }
    }
}

/// Gives up what an abandoned acquire holds, unless an acquire call watches
/// the wait again by now: its caller came back.
async fn give_up_unless_claimed(node: &Node, abandonment: Abandonment) {
    let Abandonment {
        session,
        lock,
        claim,
        ..
    } = abandonment;
    if node.waits.is_watched(session, &lock) {
        return;
    }
    let released = match claim {
        Claim::Attempt(attempt) => {
            let abandon = Proposal::abandon(session, lock.clone(), attempt);
            node.propose(abandon).await
        }
        // A grant that came before the cancel stays: it is not released.
        Claim::QueuePlace => {
            let cancel = Proposal::cancel_wait(session, lock.clone());
            node.propose(cancel).await.map(|_| None)
        }
    };
    match released {
        Ok(Some(token)) => {
            tracing::info!(
                session = session.0,
                lock,
                token = token.0,
                "released a grant whose requester went away"
            )
        }
        Ok(None) => {}
        Err(err) => {
            tracing::debug!(session = session.0, lock, message = %err.message, "abandoned acquire not cleaned up")
        }
    }
}
