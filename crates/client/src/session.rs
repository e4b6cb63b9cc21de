//! [`Session`]: a lease on the server, kept alive by a background watchdog,
//! and the client's conservative estimate of when that lease ends.
//!
//! The server counts a lease from when it *receives* a keepalive; the client
//! can only know when it *sent* one. Counting from the send time gives a
//! deadline that is never later than the server's, so when the client
//! believes it still holds the lease, it does (clock drift between the two
//! machines aside). Everything that must stop when the lease is lost watches
//! that deadline through a `watch` channel, and re-arms when a renewal moves
//! it.
//!
//! Its length (about 950 lines) is one type and its watchdog: the lease
//! deadline, the renewals that move it and every lock kind taken on the
//! session read the same state, and keeping them together keeps the loss
//! signal's rules in one file.

use crate::backoff::retry;
use crate::clock::BootInstant;
use crate::{Client, Error, ErrorKind, LockGuard, Permit, RwMode, SessionHandle};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// A session: the lease every lock it takes depends on. Cheap to clone;
/// when the last clone (including those inside [`LockGuard`]s) is dropped,
/// the watchdog stops and the session is closed in the background.
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    /// The id and the secret every call on the session must carry.
    handle: SessionHandle,
    ttl: Duration,
    lease: watch::Sender<Lease>,
    /// Notified whenever `lease.ended` is set: what each request in flight
    /// waits on, for less than a subscription to the watch costs.
    lease_ended: Arc<tokio::sync::Notify>,
    watchdog: AbortHandle,
    /// Locks held, or being acquired, through this session. The server
    /// knows only the session, so two callers taking one lock through one
    /// session would both be told they hold it: that is refused here.
    /// Keyed by the [`Claim`]'s own copy of the name: one allocation per
    /// acquire, not two. Ordered rather than hashed: a session uses a few
    /// names at a time, and hashing each with SipHash cost more than
    /// comparing it.
    in_use: std::sync::Mutex<std::collections::BTreeMap<Arc<str>, InUse>>,
    /// Lock-delay asked for with every acquire, in milliseconds.
    lock_delay_ms: std::sync::atomic::AtomicU64,
}

/// Who is using a lock name of the session.
#[derive(Debug)]
enum InUse {
    /// A caller, acquiring or holding it.
    Caller,
    /// The clean-up after an acquire whose caller went away (see
    /// [`PendingAcquire`]); a new caller waits for it.
    CleanUp(Arc<tokio::sync::Notify>),
}

/// One caller's exclusive use of a lock name within a session, from the
/// start of an acquire until its release has finished.
#[derive(Debug)]
pub(crate) struct Claim {
    session: Arc<Inner>,
    lock: Arc<str>,
}

impl Claim {
    pub(crate) fn lock(&self) -> &str {
        &self.lock
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let freed = self
            .session
            .in_use
            .lock()
            .expect("in-use lock poisoned")
            .remove(&*self.lock);
        if let Some(InUse::CleanUp(done)) = freed {
            done.notify_waiters();
        }
    }
}

/// An acquire in flight. If its future is dropped before it returns (the
/// caller gave up, say through a `select!` timeout), the server may have
/// granted the lock anyway, in a reply nobody will read: the session, kept
/// alive by its watchdog, would hold the lock forever. (The server gives
/// back what it had not yet answered when the caller left; this covers what
/// it answered as the caller left.) So a moment later, unless a new caller
/// has taken the name meanwhile, a background check releases such a grant.
struct PendingAcquire {
    session: Session,
    claim: Option<Claim>,
}

impl PendingAcquire {
    /// The acquire returned: no clean-up needed.
    fn finish(mut self) -> Claim {
        self.claim.take().expect("finished once")
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let lock = claim.lock().to_owned();
        // Free the name now: a new caller may retry straight away, and gets
        // the grant (if any) itself, acquire being idempotent.
        drop(claim);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = self.session.clone();
        runtime.spawn(async move {
            // Time for the server to finish with the abandoned request.
            tokio::time::sleep(CLEAN_UP_DELAY).await;
            // A lost lease frees everything on the server by itself.
            if session.is_lost() {
                return;
            }
            let Some(claim) = session.claim_for_clean_up(&lock) else {
                return;
            };
            match session.inner.client.lock_status(&lock).await {
                Ok(Some(state)) if state.holder_session_id == session.id() && !state.lock_delay => {
                    match session.release(&lock, state.token).await {
                        Ok(()) => tracing::info!(
                            session = session.id(),
                            lock,
                            token = state.token,
                            "released a grant whose acquire was given up"
                        ),
                        Err(error) => tracing::warn!(
                            session = session.id(),
                            lock,
                            %error,
                            "could not release a grant whose acquire was given up"
                        ),
                    }
                }
                Ok(_) => {}
                Err(error) => tracing::debug!(
                    session = session.id(),
                    lock,
                    %error,
                    "could not check for a grant after a given-up acquire; the server gives it back after its grace period"
                ),
            }
            drop(claim);
        });
    }
}

/// What the client knows about its lease.
#[derive(Debug, Clone)]
struct Lease {
    /// When the lease ends at the latest, as far as the client can tell.
    deadline: BootInstant,
    /// Set once the lease is over for a reason other than time passing.
    ended: Option<LeaseLost>,
}

/// Why a session's lease is (or must be presumed) gone. Every lock the
/// session held may now be held by someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLost {
    /// The lease ran out (or came within the requested margin of running
    /// out) without a renewal moving its deadline.
    Expired,
    /// The server said the session no longer exists or is being expired.
    Rejected(Error),
    /// The session was closed by this process.
    Closed,
}

impl fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLost::Expired => f.write_str("the lease could not be renewed in time"),
            LeaseLost::Rejected(error) => write!(f, "the server ended the session: {error}"),
            LeaseLost::Closed => f.write_str("the session was closed"),
        }
    }
}

impl LeaseLost {
    /// The error an operation on a lost session fails with.
    fn into_error(self, session: u64) -> Error {
        match self {
            LeaseLost::Rejected(error) => error,
            LeaseLost::Expired => Error::new(
                ErrorKind::SessionExpiring,
                format!("session {session} lost its lease: it could not be renewed in time"),
            ),
            LeaseLost::Closed => Error::new(
                ErrorKind::UnknownSession,
                format!("session {session} is closed"),
            ),
        }
    }
}

impl Session {
    pub(crate) async fn open(client: Client, ttl: Duration) -> Result<Session, Error> {
        let sent = BootInstant::now();
        let (handle, ttl) = client.open_session_raw(ttl).await?;
        let (lease, _) = watch::channel(Lease {
            deadline: sent + ttl,
            ended: None,
        });
        let lease_ended = Arc::new(tokio::sync::Notify::new());
        let watchdog = tokio::spawn(watchdog(
            client.clone(),
            handle.clone(),
            ttl,
            sent,
            lease.clone(),
            lease_ended.clone(),
        ))
        .abort_handle();
        tracing::debug!(session = handle.id(), ?ttl, "opened session");
        Ok(Session {
            inner: Arc::new(Inner {
                client,
                handle,
                ttl,
                lease,
                lease_ended,
                watchdog,
                in_use: Default::default(),
                lock_delay_ms: Default::default(),
            }),
        })
    }

    /// Asks for a lock-delay with every later acquire of this session: if
    /// the session *expires* while it holds a lock (not on a release or a
    /// close), the server keeps that lock from everyone for `delay`, so
    /// writes still in flight from this holder can drain before the next
    /// one starts. For resources that cannot check fencing tokens; at most
    /// 60 s. Zero (the default) turns it off.
    pub fn set_lock_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.inner
            .lock_delay_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock_delay(&self) -> Duration {
        Duration::from_millis(
            self.inner
                .lock_delay_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The server's id for this session; never reused. Public: `status`
    /// shows it to anyone, and it is not enough to act on the session.
    pub fn id(&self) -> u64 {
        self.inner.handle.id()
    }

    /// The session's id and secret: whoever has this can act on the
    /// session as its owner (keep it alive, take and release locks in it,
    /// close it), through [`Client`]'s raw calls or the CLI. Hand it only
    /// to code trusted with that, e.g. a child process that must release
    /// the lock itself.
    pub fn handle(&self) -> &SessionHandle {
        &self.inner.handle
    }

    /// The lease length the server granted.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The latest instant the lease is certain to last until: the send time
    /// of the last successful keepalive (or of the open) plus the TTL. Read
    /// it afresh rather than keeping it: it accounts for time the machine
    /// spent suspended up to the moment of the call.
    pub fn lease_deadline(&self) -> Instant {
        self.inner.lease.borrow().deadline.to_instant()
    }

    /// Whether the lease is over: its deadline passed, the server ended the
    /// session, or it was closed.
    pub fn is_lost(&self) -> bool {
        self.lost_now().is_some()
    }

    /// Completes once the lease is lost, or is within `margin` of its
    /// deadline with no renewal having moved it. Use the margin to stop work
    /// (and its writes) before the lease can actually run out; a margin of
    /// a TTL or more completes at once.
    ///
    /// The future does not borrow the session, so it can be spawned or kept
    /// across `.await`s; it also completes (with [`LeaseLost::Closed`]) when
    /// the session itself is dropped.
    pub fn lost(&self, margin: Duration) -> impl Future<Output = LeaseLost> + Send + 'static {
        let mut lease = self.inner.lease.subscribe();
        async move {
            loop {
                let alarm = {
                    let current = lease.borrow_and_update();
                    if let Some(reason) = &current.ended {
                        return reason.clone();
                    }
                    match current.deadline.checked_sub(margin) {
                        Some(alarm) => alarm,
                        None => return LeaseLost::Expired,
                    }
                };
                tokio::select! {
                    () = until(alarm) => {
                        // A renewal that landed as the alarm went off still
                        // counts: the loop looks at the new deadline first.
                        if !lease.has_changed().unwrap_or(false) {
                            return LeaseLost::Expired;
                        }
                    }
                    changed = lease.changed() => {
                        if changed.is_err() {
                            return LeaseLost::Closed;
                        }
                    }
                }
            }
        }
    }

    /// Stops renewing and ends the session on the server, which releases
    /// every lock it holds. A session the server has already forgotten
    /// counts as closed.
    pub async fn close(&self) -> Result<(), Error> {
        self.inner.watchdog.abort();
        end_lease(
            &self.inner.lease,
            &self.inner.lease_ended,
            LeaseLost::Closed,
        );
        let (client, handle) = (&self.inner.client, self.handle());
        // Past the deadline the server ends the session anyway; until then,
        // keep trying so its locks are freed now rather than at expiry.
        let deadline = self.lease_deadline();
        let attempts = retry(
            "closing the session",
            handle.id(),
            Some(deadline),
            Error::is_transient,
            || async move { client.close_session_raw(handle).await },
        );
        // A server that accepts connections but never answers (frozen, or
        // partitioned mid-stream) must not hold the caller past the point
        // where the session ends by itself.
        let started = crate::clock::now();
        let give_up = deadline.max(started + CLOSE_AT_LEAST);
        let result = match tokio::time::timeout_at(give_up.into(), attempts).await {
            Ok(result) => result,
            Err(_) => Err(no_answer("closing the session", give_up - started)),
        };
        match result {
            Err(error) if error.ends_session() => Ok(()),
            result => result,
        }
    }

    /// Whether [`close`](Self::close) was called, which released every lock
    /// the session held.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.inner.lease.borrow().ended, Some(LeaseLost::Closed))
    }

    /// Takes `lock`, waiting on the server for as long as it takes.
    ///
    /// This and the other lock methods repeat the request while the server
    /// is unreachable or not the leader, and give up once the lease is lost.
    pub async fn lock(&self, lock: &str) -> Result<LockGuard, Error> {
        self.acquire(lock, true, None).await
    }

    /// Takes `lock`, waiting on the server for at most `timeout`; after that
    /// it fails with [`ErrorKind::WaitTimeout`].
    pub async fn lock_timeout(&self, lock: &str, timeout: Duration) -> Result<LockGuard, Error> {
        self.acquire(lock, true, Some(timeout)).await
    }

    /// Takes `lock` if it is free; `None` if another session holds it.
    pub async fn try_lock(&self, lock: &str) -> Result<Option<LockGuard>, Error> {
        match self.acquire(lock, false, None).await {
            Ok(guard) => Ok(Some(guard)),
            Err(error) if error.kind() == ErrorKind::Busy => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Takes the read/write lock `lock` shared, beside other readers,
    /// waiting in its FIFO queue (behind any writer that came first) for
    /// as long as it takes. Released as [`lock`](Self::lock)'s guard is.
    pub async fn read_lock(&self, lock: &str) -> Result<LockGuard, Error> {
        self.rw_lock_within(lock, RwMode::Shared, true, None).await
    }

    /// Takes the read/write lock `lock` exclusive: alone, once every
    /// holder and everyone queued ahead is done.
    pub async fn write_lock(&self, lock: &str) -> Result<LockGuard, Error> {
        self.rw_lock_within(lock, RwMode::Exclusive, true, None)
            .await
    }

    /// [`read_lock`](Self::read_lock) or [`write_lock`](Self::write_lock),
    /// waiting at most `timeout`; after that it fails with
    /// [`ErrorKind::WaitTimeout`].
    pub async fn rw_lock_timeout(
        &self,
        lock: &str,
        mode: RwMode,
        timeout: Duration,
    ) -> Result<LockGuard, Error> {
        self.rw_lock_within(lock, mode, true, Some(timeout)).await
    }

    /// Takes the read/write lock `lock` in `mode` if that is possible now
    /// with nobody queued ahead; `None` otherwise.
    pub async fn try_rw_lock(&self, lock: &str, mode: RwMode) -> Result<Option<LockGuard>, Error> {
        match self.rw_lock_within(lock, mode, false, None).await {
            Ok(guard) => Ok(Some(guard)),
            Err(error) if error.kind() == ErrorKind::Busy => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn rw_lock_within(
        &self,
        lock: &str,
        mode: RwMode,
        wait: bool,
        timeout: Option<Duration>,
    ) -> Result<LockGuard, Error> {
        let (client, handle) = (&self.inner.client, self.handle());
        self.acquire_with(lock, timeout, |remaining| async move {
            let token = client
                .acquire_rw_raw(handle, lock, mode, wait, remaining)
                .await?;
            Ok((token, Vec::new()))
        })
        .await
    }

    /// Runs for leader of the election `election` with `value`, waiting in
    /// FIFO order among the candidates for as long as it takes
    /// (docs/elections.md). The guard's [`token`](LockGuard::token) is the
    /// term: fence with it as with a lock's token. Releasing the guard
    /// resigns; [`LockGuard::proclaim`] changes the value.
    pub async fn campaign(&self, election: &str, value: &str) -> Result<LockGuard, Error> {
        self.campaign_within(election, value, None).await
    }

    /// [`campaign`](Self::campaign), waiting at most `timeout`; after that
    /// it fails with [`ErrorKind::WaitTimeout`].
    pub async fn campaign_timeout(
        &self,
        election: &str,
        value: &str,
        timeout: Duration,
    ) -> Result<LockGuard, Error> {
        self.campaign_within(election, value, Some(timeout)).await
    }

    async fn campaign_within(
        &self,
        election: &str,
        value: &str,
        timeout: Option<Duration>,
    ) -> Result<LockGuard, Error> {
        let (client, handle) = (&self.inner.client, self.handle());
        self.acquire_with(election, timeout, |remaining| async move {
            let term = client
                .campaign_raw(handle, election, value, true, remaining)
                .await?;
            Ok((term, Vec::new()))
        })
        .await
    }

    pub(crate) async fn proclaim(
        &self,
        election: &str,
        term: u64,
        value: &str,
    ) -> Result<(), Error> {
        let client = &self.inner.client;
        client
            .proclaim_raw(self.handle(), election, term, value)
            .await
    }

    /// Takes one permit of the semaphore `semaphore` of `permits` permits
    /// (created so if nobody holds or waits on it; 0: whatever capacity it
    /// has), waiting in its FIFO queue for as long as it takes: at most
    /// `permits` holders at once. The guard's token and
    /// [`permits`](LockGuard::permits)`()[0].slot` fence the permit; see
    /// [`acquire_permits`](Self::acquire_permits) for several at once.
    pub async fn semaphore(&self, semaphore: &str, permits: u32) -> Result<LockGuard, Error> {
        self.acquire_permits(semaphore, permits, 1).await
    }

    /// Takes `count` permits of the semaphore `semaphore` (created with
    /// `capacity` permits if nobody holds or waits on it; capacity 0 takes
    /// the capacity of a semaphore that exists, such as a defined one: see
    /// [`Client::define_semaphore`](crate::Client::define_semaphore)), waiting in its
    /// FIFO queue for as long as it takes. The guard's
    /// [`permits`](LockGuard::permits) are the permits, each with its own
    /// fencing token and slot; [`token`](LockGuard::token) is the first's.
    /// Retries and the lease are handled as for [`lock`](Self::lock).
    pub async fn acquire_permits(
        &self,
        semaphore: &str,
        capacity: u32,
        count: u32,
    ) -> Result<LockGuard, Error> {
        self.acquire_permits_within(semaphore, capacity, count, true, None)
            .await
    }

    /// [`acquire_permits`](Self::acquire_permits), waiting at most
    /// `timeout`; after that it fails with [`ErrorKind::WaitTimeout`].
    pub async fn acquire_permits_timeout(
        &self,
        semaphore: &str,
        capacity: u32,
        count: u32,
        timeout: Duration,
    ) -> Result<LockGuard, Error> {
        self.acquire_permits_within(semaphore, capacity, count, true, Some(timeout))
            .await
    }

    /// Takes the permits if they are free and nobody queues ahead; `None`
    /// otherwise.
    pub async fn try_acquire_permits(
        &self,
        semaphore: &str,
        capacity: u32,
        count: u32,
    ) -> Result<Option<LockGuard>, Error> {
        match self
            .acquire_permits_within(semaphore, capacity, count, false, None)
            .await
        {
            Ok(guard) => Ok(Some(guard)),
            Err(error) if error.kind() == ErrorKind::Busy => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn acquire_permits_within(
        &self,
        semaphore: &str,
        capacity: u32,
        count: u32,
        wait: bool,
        timeout: Option<Duration>,
    ) -> Result<LockGuard, Error> {
        let (client, handle) = (&self.inner.client, self.handle());
        self.acquire_with(semaphore, timeout, |remaining| async move {
            let permits = client
                .acquire_permits_raw(handle, semaphore, capacity, count, wait, remaining)
                .await?;
            let token = permits.first().map_or(0, |permit| permit.token);
            Ok((token, permits))
        })
        .await
    }

    async fn acquire(
        &self,
        lock: &str,
        wait: bool,
        timeout: Option<Duration>,
    ) -> Result<LockGuard, Error> {
        let (client, handle) = (&self.inner.client, self.handle());
        self.acquire_with(lock, timeout, |remaining| async move {
            let lock_delay = self.lock_delay();
            let token = client
                .acquire_raw_delayed(handle, lock, wait, remaining, lock_delay)
                .await?;
            Ok((token, Vec::new()))
        })
        .await
    }

    /// An acquire of `lock` (a lock's or a semaphore's name) through
    /// `send`, which is given what is left of `timeout` and answers the
    /// grant's token and permits.
    async fn acquire_with<Fut>(
        &self,
        lock: &str,
        timeout: Option<Duration>,
        send: impl Fn(Option<Duration>) -> Fut,
    ) -> Result<LockGuard, Error>
    where
        Fut: Future<Output = Result<(u64, Vec<Permit>), Error>>,
    {
        let pending = PendingAcquire {
            session: self.clone(),
            claim: Some(self.claim(lock).await?),
        };
        // A timeout too long to represent is no timeout at all.
        let give_up = timeout.and_then(|timeout| crate::clock::now().checked_add(timeout));
        let handle = self.handle();
        let send = &send;
        // Acquire is idempotent, so a retry after an ambiguous failure gets
        // the same grant or queue place. Each retry asks the server to wait
        // only for what is left of the caller's timeout.
        let acquired = self
            .retrying("acquiring a lock", give_up, || async move {
                send(give_up.map(|at| at.saturating_duration_since(crate::clock::now()))).await
            })
            .await;
        // Returned (not dropped): the caller learns the outcome, and an
        // unknown one (an outage) the server cleans up after its grace period.
        let claim = pending.finish();
        let (token, permits) = match acquired {
            // With a timeout, transient errors are retried until it (nearly)
            // runs out: to the caller that is a timeout, not an outage.
            Err(error) if error.is_transient() && give_up.is_some() => {
                return Err(Error::new(
                    ErrorKind::WaitTimeout,
                    format!("timed out waiting for lock {lock:?} (last error: {error})"),
                ));
            }
            acquired => acquired?,
        };
        tracing::debug!(session = handle.id(), lock, token, "acquired lock");
        Ok(LockGuard::new(self.clone(), claim, token, permits))
    }

    /// Takes the lock name for the clean-up of a given-up acquire, unless a
    /// caller uses it: then the lock, if granted, is that caller's.
    fn claim_for_clean_up(&self, lock: &str) -> Option<Claim> {
        let mut in_use = self.inner.in_use.lock().expect("in-use lock poisoned");
        if in_use.contains_key(lock) {
            return None;
        }
        let done = Arc::new(tokio::sync::Notify::new());
        let lock: Arc<str> = lock.into();
        in_use.insert(lock.clone(), InUse::CleanUp(done));
        Some(Claim {
            session: self.inner.clone(),
            lock,
        })
    }

    /// Takes the lock name for one caller; waits for the clean-up of an
    /// acquire given up on it, if one is running.
    async fn claim(&self, lock: &str) -> Result<Claim, Error> {
        loop {
            let clean_up = {
                let mut in_use = self.inner.in_use.lock().expect("in-use lock poisoned");
                match in_use.get(lock) {
                    None => {
                        let lock: Arc<str> = lock.into();
                        in_use.insert(lock.clone(), InUse::Caller);
                        return Ok(Claim {
                            session: self.inner.clone(),
                            lock,
                        });
                    }
                    Some(InUse::Caller) => {
                        return Err(Error::new(
                            ErrorKind::InvalidArgument,
                            format!(
                            "lock {lock:?} is already held or being acquired through session {}; \
                                 use one session per holder",
                            self.id()
                        ),
                        ))
                    }
                    Some(InUse::CleanUp(done)) => done.clone(),
                }
            };
            let finished = clean_up.notified();
            // The clean-up may have finished between the check and here.
            if self
                .inner
                .in_use
                .lock()
                .expect("in-use lock poisoned")
                .contains_key(lock)
            {
                let _ = tokio::time::timeout(CLEAN_UP_WAIT, finished).await;
            }
        }
    }

    pub(crate) async fn release(&self, lock: &str, token: u64) -> Result<(), Error> {
        let (client, handle) = (&self.inner.client, self.handle());
        // Whether an earlier attempt may have been applied without its reply
        // reaching us (a transport failure, not a refusal like NotLeader).
        let maybe_applied = std::sync::atomic::AtomicBool::new(false);
        let maybe_applied = &maybe_applied;
        self.retrying("releasing a lock", None, || async move {
            match client.release_raw(handle, lock, token).await {
                // A live session holds its locks until it releases them, so
                // "not holder" after a lost reply means that release went
                // through. (A lost lease is reported by `retrying` itself,
                // ahead of any reply.)
                Err(error)
                    if error.kind() == ErrorKind::NotHolder
                        && maybe_applied.load(std::sync::atomic::Ordering::Relaxed) =>
                {
                    Ok(())
                }
                Err(error) => {
                    if error.kind() == ErrorKind::Unavailable {
                        maybe_applied.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(error)
                }
                ok => ok,
            }
        })
        .await?;
        tracing::debug!(session = handle.id(), lock, token, "released lock");
        Ok(())
    }

    /// Repeats an idempotent request while the server is unreachable or not
    /// the leader, for as long as the lease lasts: once it is lost, so is
    /// anything the request could have achieved, and that is the answer.
    async fn retrying<T, Fut>(
        &self,
        what: &str,
        give_up: Option<Instant>,
        request: impl FnMut() -> Fut,
    ) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        // The watchdog ends the lease at its deadline (see `watchdog`), so a
        // request waits on that signal alone. Racing a timer of its own as
        // well (`lost`) put a timer entry in tokio's wheel and took it out
        // again for every request (bench/results/2026-12-06.md).
        // Made before the look at the lease: an end signalled after it
        // still reaches this wait.
        let ended = self.inner.lease_ended.notified();
        if let Some(reason) = self.lost_now() {
            return Err(reason.into_error(self.id()));
        }
        let result = tokio::select! {
            biased;
            () = ended => {
                let reason = self.lost_now().unwrap_or(LeaseLost::Closed);
                return Err(reason.into_error(self.id()));
            }
            result = retry(what, self.id(), give_up, Error::is_transient, request) => result,
        };
        // An answer that arrives just as the lease is lost cannot be relied
        // on, so it is not reported as a success.
        match self.lost_now() {
            Some(reason) => Err(reason.into_error(self.id())),
            None => result,
        }
    }

    /// Why the lease is over, if it is: on the suspend-aware clock, so
    /// also before the watchdog has woken to say so.
    fn lost_now(&self) -> Option<LeaseLost> {
        let lease = self.inner.lease.borrow();
        match &lease.ended {
            Some(reason) => Some(reason.clone()),
            None if BootInstant::now() >= lease.deadline => Some(LeaseLost::Expired),
            None => None,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watchdog.abort();
        if self.lease.borrow().ended.is_some() {
            return;
        }
        let (client, handle) = (self.client.clone(), self.handle.clone());
        let id = handle.id();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    match client.close_session_raw(&handle).await {
                        Ok(()) => tracing::debug!(session = id, "closed dropped session"),
                        Err(error) => {
                            tracing::debug!(session = id, %error, "could not close dropped session")
                        }
                    }
                });
            }
            Err(_) => {
                tracing::debug!(
                    session = id,
                    "dropped outside a runtime; the lease will expire"
                )
            }
        }
    }
}

/// Renews the lease every third of its TTL until the server rejects it or
/// the deadline passes unrenewed, and then ends it: requests in flight
/// learn that the lease is lost from this task alone, so it waits on the
/// suspend-aware clock (`until`) and ends the lease at its deadline even
/// when the machine slept through it. Holds no [`Session`], so that
/// dropping the last one can stop it.
async fn watchdog(
    client: Client,
    handle: SessionHandle,
    ttl: Duration,
    mut last_sent: BootInstant,
    lease: watch::Sender<Lease>,
    lease_ended: Arc<tokio::sync::Notify>,
) {
    let interval = ttl / 3;
    let (client, handle, id) = (&client, &handle, handle.id());
    let reason = loop {
        until(last_sent + interval).await;
        let deadline = lease.borrow().deadline;
        // Anything short of the server disowning the session is worth
        // retrying while the lease lasts; an attempt that hangs is abandoned
        // after `interval` so a fresh one can go out.
        let renewal = retry(
            "keepalive",
            id,
            Some(deadline.to_instant()),
            |error| !error.ends_session(),
            || async move {
                let sent = BootInstant::now();
                let (_, generation, _) = client.endpoint_now();
                match tokio::time::timeout(interval, client.keep_alive_raw(handle)).await {
                    Ok(granted) => granted.map(|granted| (sent, granted)),
                    Err(_) => {
                        // A node that takes calls and never answers (paused, or
                        // a leader cut off from the others, waiting for a
                        // quorum it will not get): the next attempt goes to
                        // another, or the lease runs out on that one; and the
                        // calls waiting there with this one go too.
                        let error = no_answer("keepalive", interval);
                        client.abandon(generation, &error.to_string());
                        Err(error)
                    }
                }
            },
        );
        let renewed = tokio::select! {
            biased;
            renewed = renewal => Ok(renewed),
            () = until(deadline) => Err(()),
        };
        match renewed {
            Ok(Ok((sent, granted))) => {
                last_sent = sent;
                lease.send_modify(|lease| {
                    lease.deadline = renewed_deadline(lease.deadline, sent, granted);
                });
            }
            Ok(Err(error)) if error.ends_session() => {
                tracing::warn!(session = id, %error, "lease lost: the server ended the session");
                break LeaseLost::Rejected(error);
            }
            Ok(Err(error)) => {
                tracing::warn!(session = id, %error, "lease lost: could not renew it in time");
                break LeaseLost::Expired;
            }
            Err(_) => {
                tracing::warn!(session = id, "lease lost: could not renew it in time");
                break LeaseLost::Expired;
            }
        }
    };
    let expired = reason == LeaseLost::Expired;
    end_lease(&lease, &lease_ended, reason);
    if expired {
        // The server may still count the lease as live; ending it now frees
        // its locks for others sooner. Best effort: the server was likely
        // unreachable a moment ago.
        let closed = tokio::time::timeout(interval, client.close_session_raw(handle))
            .await
            .unwrap_or_else(|_| Err(no_answer("closing the session", interval)));
        if let Err(error) = closed {
            tracing::debug!(session = id, %error, "could not close the expired session");
        }
    }
}

/// How long a new acquire waits for the clean-up of a given-up one before
/// looking again (the clean-up is a status read and maybe a release).
const CLEAN_UP_WAIT: Duration = Duration::from_millis(100);

/// How long after an acquire is given up its clean-up looks for a grant.
const CLEAN_UP_DELAY: Duration = Duration::from_secs(1);

/// How often a waiter on the lease re-checks the suspend-aware clock.
const SUSPEND_CHECK: Duration = Duration::from_secs(1);

/// Sleeps until the suspend-aware clock reaches `at`. Tokio's timers stop
/// while the machine is suspended, so it wakes now and then to look.
async fn until(at: BootInstant) {
    while BootInstant::now() < at {
        let wake = at.to_instant().min(crate::clock::now() + SUSPEND_CHECK);
        tokio::time::sleep_until(wake.into()).await;
    }
}

/// How long `close` keeps trying when the lease is (nearly) over anyway.
const CLOSE_AT_LEAST: Duration = Duration::from_secs(1);

/// A request given up on after waiting `waited` for an answer.
fn no_answer(what: &str, waited: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{what} got no answer within {waited:?}"),
    )
}

fn end_lease(lease: &watch::Sender<Lease>, ended: &tokio::sync::Notify, reason: LeaseLost) {
    lease.send_modify(|lease| {
        lease.ended.get_or_insert(reason);
    });
    ended.notify_waiters();
}

/// The deadline after a keepalive sent at `sent` was granted `granted`. The
/// server counts from when it received the keepalive, which is no earlier
/// than `sent`; and it never shortens a lease, so neither does this.
fn renewed_deadline(current: BootInstant, sent: BootInstant, granted: Duration) -> BootInstant {
    current.max(sent + granted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(9);

    #[test]
    fn renewal_counts_from_the_send_time() {
        let opened = BootInstant::now();
        let sent = opened + Duration::from_secs(3);
        assert_eq!(renewed_deadline(opened + TTL, sent, TTL), sent + TTL);
    }

    #[test]
    fn renewal_never_shortens_the_lease() {
        let opened = BootInstant::now();
        let deadline = opened + TTL;
        // A smaller TTL granted soon after opening would end before the
        // deadline already known.
        let sent = opened + Duration::from_secs(1);
        assert_eq!(renewed_deadline(deadline, sent, TTL / 3), deadline);
    }
}
