//! One lock API over the lock systems teams already run: the Deadbolt
//! server, Redis (one server), Redlock, etcd and PostgreSQL, each done the
//! way its own documentation says is right and each labelled with what it
//! really guarantees ([`Backend::label`]), so that a team can lock with what
//! it has today, see the cost, and move to Deadbolt when correctness
//! matters.
//!
//! The shape mirrors `deadbolt-client`: a [`Locker`] (from a URL, its scheme
//! choosing the backend, see [`Target`]), a [`Session`] per holder, a
//! [`Guard`] per held lock with [`Guard::token`] and [`Guard::lost`]. A
//! backend without fencing tokens says so in the type ([`Token::None`]), and
//! one whose counter is not safe says that ([`Token::Counter`]): never a
//! made-up number.
//!
//! ```no_run
//! use deadbolt_backends::{Locker, Token};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), deadbolt_backends::Error> {
//! let locker = Locker::connect("etcd://127.0.0.1:2379").await?;
//! let session = locker.open_session(Duration::from_secs(10)).await?;
//! let guard = session.lock_timeout("nightly-report", Duration::from_secs(30)).await?;
//! if let Token::Fencing(token) = guard.token() {
//!     println!("write with fencing token {token}");
//! }
//! tokio::select! {
//!     () = async { /* the work */ } => guard.release().await?,
//!     reason = guard.lost(Duration::from_secs(2)) => eprintln!("stopped: {reason}"),
//! }
//! # Ok(())
//! # }
//! ```

mod deadbolt;
mod error;
mod etcd;
mod labels;
mod lease;
mod postgres;
mod redis;
mod redlock;
mod target;

pub use error::{Error, ErrorKind};
pub use labels::{Backend, Label, LABELS};
pub use lease::Lost;
pub use target::{
    redact, EtcdTls, PostgresTls, RedisNode, RedisTls, Secret, SslMode, Target, MAX_NODES,
    MIN_REDLOCK_NODES,
};

use deadbolt_client::Backoff;
use futures::future::Either;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a grant comes with, by what the backend can honestly give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// A fencing token: larger than every earlier grant's, through crashes
    /// and failovers of the lock service (Deadbolt, etcd, PostgreSQL on one
    /// primary). Pass it with every write the lock protects.
    Fencing(u64),
    /// A counter that grows with grants only while the Redis server keeps
    /// its memory: a restart without persistence or a failover can repeat
    /// it. Catches a paused holder on a healthy server; not a fencing token.
    Counter(u64),
    /// The backend issues no token (Redlock; Redis without `?fence=counter`).
    None,
}

impl Token {
    /// The fencing token, if this is one.
    pub fn fencing(self) -> Option<u64> {
        match self {
            Token::Fencing(token) => Some(token),
            Token::Counter(_) | Token::None => None,
        }
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Fencing(token) => write!(f, "{token}"),
            Token::Counter(counter) => write!(f, "counter {counter} (not a fencing token)"),
            Token::None => f.write_str("none (this backend issues no fencing token)"),
        }
    }
}

/// An election's leader, as [`Locker::leader`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// What the leader proclaimed (or campaigned with).
    pub value: String,
    /// Its term: the fencing token of its leadership.
    pub token: Token,
}

/// A lock service, named by URL. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Locker {
    kind: LockerKind,
    backend: Backend,
}

#[derive(Debug, Clone)]
enum LockerKind {
    Deadbolt(deadbolt::Locker),
    Redis(redis::Locker),
    Etcd(etcd::Locker),
    // Boxed: a parsed libpq config is large.
    Postgres(Box<postgres::Locker>),
}

impl Locker {
    /// Parses `url` (see [`Target`]). Only the Deadbolt client connects
    /// here; the others connect per session.
    pub async fn connect(url: &str) -> Result<Locker, Error> {
        let target = Target::parse(url)?;
        let backend = target.backend();
        let kind = match target {
            Target::Deadbolt { endpoints } => {
                LockerKind::Deadbolt(deadbolt::Locker::connect(endpoints).await?)
            }
            Target::Redis { node, fence } => LockerKind::Redis(redis::Locker::single(node, fence)?),
            Target::Redlock { nodes } => LockerKind::Redis(redis::Locker::redlock(nodes)?),
            Target::Etcd {
                endpoints,
                user,
                tls,
            } => LockerKind::Etcd(etcd::Locker::new(endpoints, user, tls)?),
            Target::Postgres {
                url,
                idle_timeout,
                tls,
            } => LockerKind::Postgres(Box::new(postgres::Locker::new(&url, idle_timeout, tls)?)),
        };
        Ok(Locker { kind, backend })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Who leads `election` now, if anyone (etcd only, as
    /// [`Session::campaign`]).
    pub async fn leader(&self, election: &str) -> Result<Option<Leader>, Error> {
        deadbolt_core::validate_lock_name(election)
            .map_err(|err| Error::invalid(err.to_string()))?;
        match &self.kind {
            LockerKind::Etcd(locker) => locker.leader(election).await,
            _ => Err(no_elections()),
        }
    }

    /// A session for one holder, with leases of `ttl` (etcd rounds it up to
    /// whole seconds).
    pub async fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        deadbolt_core::validate_ttl(ttl).map_err(|err| Error::invalid(err.to_string()))?;
        let kind = match &self.kind {
            LockerKind::Deadbolt(locker) => SessionKind::Deadbolt(locker.open_session(ttl).await?),
            LockerKind::Redis(locker) => SessionKind::Redis(locker.open_session(ttl)?),
            LockerKind::Etcd(locker) => SessionKind::Etcd(locker.open_session(ttl).await?),
            LockerKind::Postgres(locker) => SessionKind::Postgres(locker.open_session(ttl).await?),
        };
        Ok(Session {
            kind,
            claims: Default::default(),
        })
    }
}

/// One holder's connection (and, for etcd, PostgreSQL and Deadbolt, its
/// lease). Take each lock name through one session at a time.
#[derive(Debug)]
pub struct Session {
    kind: SessionKind,
    claims: Arc<Mutex<HashSet<String>>>,
}

#[derive(Debug)]
enum SessionKind {
    Deadbolt(deadbolt_client::Session),
    Redis(redis::Session),
    Etcd(etcd::Session),
    Postgres(postgres::Session),
}

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy)]
enum Wait {
    No,
    Until(Option<Instant>),
}

/// Retry delays of a polling acquire (Redis, Redlock, PostgreSQL) while
/// the lock is busy: exponential with full jitter, so waiters spread out
/// instead of hammering the server together; capped so a freed lock is
/// noticed within a quarter second.
const POLL_BASE: Duration = Duration::from_millis(5);
const POLL_CAP: Duration = Duration::from_millis(250);

/// How a lock is held: alone, or beside other shared holders (only
/// PostgreSQL offers that natively: `pg_advisory_lock_shared`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
}

impl Session {
    /// Takes `lock`, waiting as long as it takes.
    pub async fn lock(&self, lock: &str) -> Result<Guard, Error> {
        self.acquire(lock, Wait::Until(None), Mode::Exclusive).await
    }

    /// Takes `lock`, waiting at most `timeout` ([`ErrorKind::WaitTimeout`]).
    pub async fn lock_timeout(&self, lock: &str, timeout: Duration) -> Result<Guard, Error> {
        self.lock_in(lock, Mode::Exclusive, Some(timeout)).await
    }

    /// Takes `lock` in `mode`, waiting at most `timeout` (`None`: as long as
    /// it takes). [`Mode::Shared`] is PostgreSQL's shared advisory lock
    /// (beside other shared holders, never beside an exclusive one; a
    /// stream of readers can keep a writer waiting); the other backends
    /// refuse it with [`ErrorKind::InvalidArgument`].
    pub async fn lock_in(
        &self,
        lock: &str,
        mode: Mode,
        timeout: Option<Duration>,
    ) -> Result<Guard, Error> {
        let give_up = timeout.map(|timeout| Instant::now().checked_add(timeout));
        self.acquire(lock, Wait::Until(give_up.flatten()), mode)
            .await
    }

    /// Takes `lock` if it is free; `None` if someone else holds it.
    pub async fn try_lock(&self, lock: &str) -> Result<Option<Guard>, Error> {
        self.try_lock_in(lock, Mode::Exclusive).await
    }

    /// [`try_lock`](Self::try_lock) in `mode` (see [`lock_in`](Self::lock_in)).
    pub async fn try_lock_in(&self, lock: &str, mode: Mode) -> Result<Option<Guard>, Error> {
        match self.acquire(lock, Wait::No, mode).await {
            Ok(guard) => Ok(Some(guard)),
            Err(error) if error.kind() == ErrorKind::Busy => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Campaigns in the election `election` with `value`, waiting at most
    /// `timeout` (`None`: as long as it takes) to lead; the guard's token
    /// is the term, and releasing it resigns. Elections are etcd's here
    /// (its v3election service: FIFO, leased, the leader key's create
    /// revision a fencing token); the other backends refuse them with
    /// [`ErrorKind::InvalidArgument`].
    pub async fn campaign(
        &self,
        election: &str,
        value: &str,
        timeout: Option<Duration>,
    ) -> Result<Guard, Error> {
        deadbolt_core::validate_lock_name(election)
            .map_err(|err| Error::invalid(err.to_string()))?;
        let SessionKind::Etcd(session) = &self.kind else {
            return Err(no_elections());
        };
        let claim = self.claim(election)?;
        let give_up = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        let (held, token) = session
            .campaign(election, value, give_up.map(Into::into))
            .await?;
        let mut guard = Guard::new(election, token, Held::Etcd(held), Some(claim));
        guard.election = true;
        Ok(guard)
    }

    /// Ends the session: its leases and whatever locks it still holds.
    pub async fn close(self) -> Result<(), Error> {
        match self.kind {
            SessionKind::Deadbolt(session) => Ok(session.close().await?),
            SessionKind::Etcd(session) => session.close().await,
            // Dropping closes the connection (PostgreSQL); Redis locks end
            // with their guards.
            SessionKind::Redis(_) | SessionKind::Postgres(_) => Ok(()),
        }
    }

    async fn acquire(&self, name: &str, wait: Wait, mode: Mode) -> Result<Guard, Error> {
        deadbolt_core::validate_lock_name(name).map_err(|err| Error::invalid(err.to_string()))?;
        let shared = mode == Mode::Shared;
        if shared && !matches!(self.kind, SessionKind::Postgres(_)) {
            return Err(Error::invalid(
                "shared locks are PostgreSQL's here (pg_advisory_lock_shared); this lock system \
                 has none (`deadbolt backends` says what each offers; the Deadbolt server's \
                 read/write locks are `deadbolt run --shared` without --backend)",
            ));
        }
        match &self.kind {
            SessionKind::Deadbolt(session) => {
                let (guard, token) = match wait {
                    Wait::No => deadbolt::try_acquire(session, name)
                        .await?
                        .ok_or_else(|| busy(name))?,
                    Wait::Until(give_up) => {
                        let timeout =
                            give_up.map(|at| at.saturating_duration_since(Instant::now()));
                        deadbolt::acquire(session, name, timeout).await?
                    }
                };
                // deadbolt-client keeps its own one-caller-per-name rule.
                Ok(Guard::new(name, token, Held::Deadbolt(guard), None))
            }
            SessionKind::Redis(session) => {
                self.polled(name, wait, || session.try_acquire(name), Held::Redis)
                    .await
            }
            SessionKind::Postgres(session) => {
                let attempt = || session.try_acquire(name, shared);
                self.polled(name, wait, attempt, Held::Postgres).await
            }
            SessionKind::Etcd(session) => {
                let claim = self.claim(name)?;
                let (held, token) = match wait {
                    Wait::No => session.try_acquire(name).await?.ok_or_else(|| busy(name))?,
                    // etcd waits on the server, in its FIFO queue.
                    Wait::Until(give_up) => session.acquire(name, give_up.map(Into::into)).await?,
                };
                Ok(Guard::new(name, token, Held::Etcd(held), Some(claim)))
            }
        }
    }

    /// An acquire by polling `attempt` (see [`poll`]).
    async fn polled<H, Fut>(
        &self,
        name: &str,
        wait: Wait,
        mut attempt: impl FnMut() -> Fut,
        held: fn(H) -> Held,
    ) -> Result<Guard, Error>
    where
        Fut: Future<Output = Result<Option<(H, Token)>, Error>>,
    {
        let claim = self.claim(name)?;
        let (granted, token) = match wait {
            Wait::No => attempt().await?.ok_or_else(|| busy(name))?,
            Wait::Until(give_up) => poll(name, give_up, attempt).await?,
        };
        Ok(Guard::new(name, token, held(granted), Some(claim)))
    }

    /// One caller per lock name per session: the servers know only the
    /// session (or, for PostgreSQL, count re-entries), so two callers taking
    /// one name through one session would both be told they hold it.
    fn claim(&self, name: &str) -> Result<Claim, Error> {
        let mut claims = self.claims.lock().expect("claims lock poisoned");
        if !claims.insert(name.to_owned()) {
            return Err(Error::invalid(format!(
                "lock {name:?} is already held or being acquired through this session; use one \
                 session per holder"
            )));
        }
        Ok(Claim {
            claims: self.claims.clone(),
            name: name.to_owned(),
        })
    }
}

fn no_elections() -> Error {
    Error::invalid(
        "elections are etcd's here (its v3election service); this lock system has none \
         (`deadbolt backends` says what each offers; the Deadbolt server's elections are \
         `deadbolt elect` without --backend)",
    )
}

fn busy(name: &str) -> Error {
    Error::new(
        ErrorKind::Busy,
        format!("lock {name:?} is held by someone else"),
    )
}

/// How long a wait with no deadline goes on while the lock system answers
/// nothing: as the Deadbolt client repeats a call through an outage for 10
/// s. Past it the wait fails `unavailable` (`deadbolt run` exits 69), where
/// it used to retry forever without a word: a cron job started while Redis
/// was down hung, and the next runs piled up behind it.
const UNREACHABLE_FOR: Duration = Duration::from_secs(10);

/// Tries `attempt` until it grants, with backoff and full jitter while the
/// lock is busy or the server unreachable, until `give_up` (if any), when
/// it makes one last attempt. Without `give_up`, until the server has been
/// unreachable for [`UNREACHABLE_FOR`] in a row.
async fn poll<T, Fut>(
    name: &str,
    give_up: Option<Instant>,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<Option<T>, Error>>,
{
    let started = Instant::now();
    let mut backoff = Backoff::new(POLL_BASE, POLL_CAP);
    // tokio's clock, which tests can pause.
    let mut unreachable_since = None;
    loop {
        let failure = match attempt().await {
            Ok(Some(granted)) => return Ok(granted),
            Ok(None) => None,
            Err(error) if error.is_transient() => Some(error),
            Err(error) => return Err(error),
        };
        match &failure {
            None => unreachable_since = None,
            Some(error) => {
                let since = *unreachable_since.get_or_insert_with(tokio::time::Instant::now);
                if give_up.is_none() && since.elapsed() >= UNREACHABLE_FOR {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("{error} (no answer for {UNREACHABLE_FOR:?}; gave up waiting for lock {name:?})"),
                    ));
                }
            }
        }
        let mut delay = backoff.next_delay(&mut rand::thread_rng());
        if let Some(give_up) = give_up {
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let timed_out = Error::timed_out(name, started.elapsed());
                return Err(match failure {
                    Some(error) => Error::new(
                        ErrorKind::WaitTimeout,
                        format!("{timed_out} (last error: {error})"),
                    ),
                    None => timed_out,
                });
            }
            // One last attempt at the deadline itself.
            delay = delay.min(left);
        }
        tokio::time::sleep(delay).await;
    }
}

/// A lock name in use by one caller of a session, until its guard is done.
#[derive(Debug)]
struct Claim {
    claims: Arc<Mutex<HashSet<String>>>,
    name: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims
            .lock()
            .expect("claims lock poisoned")
            .remove(&self.name);
    }
}

#[derive(Debug)]
enum Held {
    Deadbolt(deadbolt_client::LockGuard),
    Redis(redis::Held),
    Etcd(etcd::Held),
    Postgres(postgres::Held),
}

impl Held {
    /// The lease this lock depends on; Deadbolt's client keeps its own.
    fn lease(&self) -> Result<&lease::Lease, &deadbolt_client::LockGuard> {
        match self {
            Held::Deadbolt(guard) => Err(guard),
            Held::Redis(held) => Ok(held.lease()),
            Held::Etcd(held) => Ok(held.lease()),
            Held::Postgres(held) => Ok(held.lease()),
        }
    }

    async fn release(self, name: &str) -> Result<(), Error> {
        match self {
            Held::Deadbolt(guard) => Ok(guard.release().await?),
            Held::Redis(held) => held.release(name).await,
            Held::Etcd(held) => held.release(name).await,
            Held::Postgres(held) => held.release(name).await,
        }
    }
}

/// A held lock. Release it with [`release`](Self::release) to learn whether
/// it was still held; dropping it releases in the background.
#[derive(Debug)]
pub struct Guard {
    name: String,
    token: Token,
    held: Option<Held>,
    /// Kept until the release is done, so no acquire of the same name
    /// through the session can overtake it.
    claim: Option<Claim>,
    /// Won by [`Session::campaign`]: its holder may
    /// [`proclaim`](Self::proclaim).
    election: bool,
}

impl Guard {
    fn new(name: &str, token: Token, held: Held, claim: Option<Claim>) -> Guard {
        Guard {
            name: name.to_owned(),
            token,
            held: Some(held),
            claim,
            election: false,
        }
    }

    /// Tells everyone a new value of this leadership (etcd's `Proclaim`),
    /// if it still leads: otherwise [`ErrorKind::LockLost`].
    pub async fn proclaim(&self, value: &str) -> Result<(), Error> {
        match self.held() {
            Held::Etcd(held) if self.election => held.proclaim(&self.name, value).await,
            _ => Err(Error::invalid(format!(
                "{:?} is a lock, not an election: only a campaign's guard proclaims",
                self.name
            ))),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The grant's token, or what the backend has instead.
    pub fn token(&self) -> Token {
        self.token
    }

    fn held(&self) -> &Held {
        self.held.as_ref().expect("held until released")
    }

    /// Completes once the lock's lease is lost, or is within `margin` of
    /// its deadline with no renewal having moved it. Does not borrow the
    /// guard.
    pub fn lost(&self, margin: Duration) -> impl Future<Output = Lost> + Send + 'static {
        match self.held().lease() {
            Ok(lease) => Either::Left(lease.lost(margin)),
            Err(guard) => Either::Right(deadbolt::lost(guard, margin)),
        }
    }

    /// The latest instant the lease is certain to last until.
    pub fn lease_deadline(&self) -> Instant {
        match self.held().lease() {
            Ok(lease) => lease.deadline().into_std(),
            Err(guard) => deadbolt::lease_deadline(guard),
        }
    }

    /// Releases the lock. [`ErrorKind::LockLost`] means it had already been
    /// lost, so what was done under it may have overlapped another holder.
    pub async fn release(mut self) -> Result<(), Error> {
        let held = self.held.take().expect("held until released");
        let result = held.release(&self.name).await;
        self.claim.take();
        result
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let (name, claim) = (std::mem::take(&mut self.name), self.claim.take());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = held.release(&name).await {
                        tracing::warn!(lock = name, %error, "could not release a dropped guard");
                    }
                    drop(claim);
                });
            }
            Err(_) => tracing::debug!(
                lock = name,
                "guard dropped outside a runtime; the lock is freed when its lease ends"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> Error {
        Error::unavailable("redis://127.0.0.1:1", "Connection refused")
    }

    /// Regression: `deadbolt run --backend redis://...` with no `--wait`
    /// hung forever, silently, while Redis was down.
    #[tokio::test(start_paused = true)]
    async fn a_wait_without_deadline_gives_up_on_a_server_that_never_answers() {
        let started = tokio::time::Instant::now();
        let outcome: Result<(), Error> = poll("job", None, || async { Err(refused()) }).await;
        let error = outcome.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
        assert!(error.to_string().contains("Connection refused"), "{error}");
        let waited = started.elapsed();
        assert!(
            (UNREACHABLE_FOR..UNREACHABLE_FOR + POLL_CAP * 2).contains(&waited),
            "gave up after {waited:?}"
        );
    }

    /// Only an outage in a row counts: a server that answers "busy" in
    /// between is there, and the wait goes on for as long as the lock is held.
    #[tokio::test(start_paused = true)]
    async fn a_wait_without_deadline_outlasts_outages_shorter_than_the_limit() {
        let started = tokio::time::Instant::now();
        let outcome = poll("job", None, || async move {
            let at = started.elapsed();
            let outage = UNREACHABLE_FOR * 9 / 10;
            match at {
                at if at < outage => Err(refused()),
                at if at < outage + Duration::from_secs(1) => Ok(None),
                at if at < outage * 2 + Duration::from_secs(1) => Err(refused()),
                _ => Ok(Some(7)),
            }
        })
        .await;
        assert_eq!(outcome.unwrap(), 7);
    }

    /// `Debug` of a locker and of a session shows no password (the client
    /// libraries' own `Debug` may: redis-rs's does). These connect nothing.
    #[tokio::test]
    async fn debug_output_shows_no_password() {
        for url in [
            "redis://:hunter2@127.0.0.1:1",
            "rediss://user:hunter2@127.0.0.1:1",
            "redlock://:hunter2@127.0.0.1:1,u:hunter2@127.0.0.1:2,127.0.0.1:3",
            "etcd://root:hunter2@127.0.0.1:1",
            "postgres://app:hunter2@127.0.0.1:1/db?sslmode=require",
            "postgres://app@127.0.0.1:1/db?password=hunter2",
        ] {
            let locker = Locker::connect(url).await.unwrap();
            let shown = format!("{locker:?}");
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
            if let LockerKind::Redis(_) = locker.kind {
                let session = locker.open_session(Duration::from_secs(1)).await.unwrap();
                let shown = format!("{session:?}");
                assert!(!shown.contains("hunter2"), "{url}: {shown}");
            }
        }
    }
}
