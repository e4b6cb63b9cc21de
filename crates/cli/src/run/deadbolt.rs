//! `deadbolt run` against the Deadbolt server: every primitive (a lock,
//! a read/write lock, a semaphore permit, an election), the lock-delay,
//! and `--once` (a marker in the fenced store, written only by the grant
//! that ran the command).

use super::command::{run_holding, Holding, LockSystem, RunArgs};
use crate::locks::LockArgs;
use crate::{exit, Endpoints};
use deadbolt_client::{Client, ErrorKind, LeaseLost, LockGuard, RwMode, Session};
use std::future::Future;
use std::time::{Duration, Instant};

/// A session on the Deadbolt server, with its lock-delay set.
pub struct Deadbolt {
    client: Client,
    session: Session,
}

impl Deadbolt {
    /// Connects (waiting for the server as long as the lock would be waited
    /// for) and opens the session; or, having said why not, the exit code.
    pub async fn open(endpoints: &Endpoints, args: &RunArgs) -> Result<Deadbolt, i32> {
        let patience = if args.target.no_wait {
            None
        } else {
            args.target.wait
        };
        let client = crate::locks::connect_within(endpoints, patience).await?;
        let session = client
            .open_session(args.target.ttl)
            .await
            .map_err(|err| exit::report(&err))?;
        session.set_lock_delay(args.target.lock_delay);
        Ok(Deadbolt { client, session })
    }
}

impl LockSystem for Deadbolt {
    type Held = LockGuard;

    async fn take(&self, args: &RunArgs) -> Result<LockGuard, i32> {
        take_lock(&self.session, args).await
    }

    async fn run(
        &self,
        held: &LockGuard,
        args: &RunArgs,
        grace: Duration,
        margin: Duration,
    ) -> i32 {
        match &args.once {
            Some(key) => run_once(&self.client, held, key, args, grace, margin).await,
            None => run_holding(held, args, grace, margin).await,
        }
    }

    /// The lock may already be lost; releasing by token is safe either way
    /// (a stale token is refused).
    async fn release(&self, held: LockGuard) {
        let lock = held.name().to_owned();
        if let Err(err) = held.release().await {
            eprintln!("deadbolt run: releasing lock {lock:?}: {err}");
        }
    }

    async fn close(self) {
        if let Err(err) = self.session.close().await {
            tracing::debug!(%err, "closing the session failed; it will expire");
        }
    }
}

async fn take_lock(session: &Session, args: &RunArgs) -> Result<LockGuard, i32> {
    let target = &args.target;
    let taken = match (&target.semaphore, target.permits) {
        // No capacity (0): the semaphore's own, as it was defined.
        (Some(semaphore), capacity) => {
            take_permit(session, semaphore, capacity.unwrap_or(0), target).await
        }
        _ if target.rw_mode().is_some() => {
            let mode = target.rw_mode().expect("a read/write mode");
            take_rw_lock(session, &target.lock, mode, target).await
        }
        (None, _) if target.election.is_some() => {
            let election = target.election.as_deref().expect("an election");
            // Without waiting: a campaign that gives up at once.
            let wait = match target.no_wait {
                true => Some(Duration::ZERO),
                false => target.wait,
            };
            match wait {
                Some(wait) => {
                    session
                        .campaign_timeout(election, &target.value, wait)
                        .await
                }
                None => session.campaign(election, &target.value).await,
            }
            .map(Some)
        }
        _ if target.no_wait => session.try_lock(&target.lock).await,
        _ => match target.wait {
            Some(wait) => session.lock_timeout(&target.lock, wait).await.map(Some),
            None => session.lock(&target.lock).await.map(Some),
        },
    };
    let taken = match taken {
        Ok(Some(guard)) => Ok(guard),
        Ok(None) => {
            eprintln!("deadbolt run: {} is busy", target.described());
            return Err(exit::BUSY);
        }
        Err(err) => Err(err),
    };
    taken.map_err(|err| {
        if err.kind() == ErrorKind::WaitTimeout {
            eprintln!("deadbolt run: timed out waiting for {}", target.described());
            exit::BUSY
        } else {
            exit::report(&err)
        }
    })
}

/// One permit of `semaphore`; `None` if busy and the caller would not wait.
async fn take_permit(
    session: &Session,
    semaphore: &str,
    capacity: u32,
    target: &LockArgs,
) -> Result<Option<LockGuard>, deadbolt_client::Error> {
    if target.no_wait {
        return session.try_acquire_permits(semaphore, capacity, 1).await;
    }
    match target.wait {
        Some(wait) => session
            .acquire_permits_timeout(semaphore, capacity, 1, wait)
            .await
            .map(Some),
        None => session
            .acquire_permits(semaphore, capacity, 1)
            .await
            .map(Some),
    }
}

/// The read/write lock `lock` in `mode`; `None` if busy and the caller
/// would not wait.
async fn take_rw_lock(
    session: &Session,
    lock: &str,
    mode: RwMode,
    target: &LockArgs,
) -> Result<Option<LockGuard>, deadbolt_client::Error> {
    if target.no_wait {
        return session.try_rw_lock(lock, mode).await;
    }
    match target.wait {
        Some(wait) => session.rw_lock_timeout(lock, mode, wait).await.map(Some),
        None if mode == RwMode::Shared => session.read_lock(lock).await.map(Some),
        None => session.write_lock(lock).await.map(Some),
    }
}

/// `--once KEY`: a fenced read of the marker first (so that an older holder
/// still running can no longer mark it), the command only if unmarked, and
/// the mark only if the command succeeded and this grant is still current.
async fn run_once(
    client: &Client,
    guard: &LockGuard,
    key: &str,
    args: &RunArgs,
    grace: Duration,
    margin: Duration,
) -> i32 {
    let fence = Some((guard.token(), Some(guard.name())));
    match client.store_get(key, fence).await {
        Ok(stored) => {
            if let Some(done) = stored.value {
                eprintln!(
                    "deadbolt run: {key:?} is already done ({done}); not running the command"
                );
                return exit::OK;
            }
        }
        Err(err) => return exit::report(&err),
    }
    let code = run_holding(guard, args, grace, margin).await;
    if code != exit::OK {
        return code;
    }
    let done = format!(
        "done at {} with token {}",
        humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
        guard.token()
    );
    match client
        .store_put(key, &done, guard.token(), Some(guard.name()))
        .await
    {
        Ok(_) => code,
        Err(err) => {
            eprintln!(
                "deadbolt run: the command succeeded, but {key:?} could not be marked done: {err}"
            );
            exit::code_of(&err)
        }
    }
}

impl Holding for LockGuard {
    fn at_risk(&self, margin: Duration) -> impl Future<Output = (String, bool)> + Send + 'static {
        let lost = self.session().lost(margin);
        async move {
            let reason = lost.await;
            // Rejected or closed: the server already let go.
            let ours = matches!(reason, LeaseLost::Expired);
            (reason.to_string(), ours)
        }
    }

    fn lease_deadline(&self) -> Instant {
        self.session().lease_deadline()
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("DEADBOLT_LOCK", self.name().to_owned()),
            ("DEADBOLT_TOKEN", self.token().to_string()),
            // A semaphore permit's slot (0..permits): no other live permit
            // has it, so the command may use it to pick its resource.
            (
                "DEADBOLT_SLOT",
                self.permits()
                    .first()
                    .map_or_else(String::new, |permit| permit.slot.to_string()),
            ),
            // The handle (id and secret): the command may act on its own
            // session, e.g. `deadbolt keepalive --session "$DEADBOLT_SESSION"`.
            ("DEADBOLT_SESSION", self.session().handle().to_string()),
        ]
    }
}
