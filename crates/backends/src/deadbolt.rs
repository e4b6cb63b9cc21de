//! The Deadbolt server as one backend among the others: a thin adapter over
//! `deadbolt-client`, which already has the session, watchdog, guard and
//! `lost()` this crate's API mirrors. Nothing is re-implemented here; the
//! token is the server's fencing token.

use crate::{Error, Lost, Token};
use deadbolt_client::{Client, LockGuard, Session};
use std::future::Future;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub(crate) struct Locker {
    client: Client,
}

impl Locker {
    pub(crate) async fn connect(endpoints: Vec<String>) -> Result<Locker, Error> {
        Ok(Locker {
            client: Client::connect(endpoints).await?,
        })
    }

    pub(crate) async fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        Ok(self.client.open_session(ttl).await?)
    }
}

pub(crate) async fn try_acquire(
    session: &Session,
    name: &str,
) -> Result<Option<(LockGuard, Token)>, Error> {
    let guard = session.try_lock(name).await?;
    Ok(guard.map(with_token))
}

pub(crate) async fn acquire(
    session: &Session,
    name: &str,
    timeout: Option<Duration>,
) -> Result<(LockGuard, Token), Error> {
    let guard = match timeout {
        Some(timeout) => session.lock_timeout(name, timeout).await?,
        None => session.lock(name).await?,
    };
    Ok(with_token(guard))
}

fn with_token(guard: LockGuard) -> (LockGuard, Token) {
    let token = Token::Fencing(guard.token());
    (guard, token)
}

pub(crate) fn lost(
    guard: &LockGuard,
    margin: Duration,
) -> impl Future<Output = Lost> + Send + 'static {
    let lost = guard.session().lost(margin);
    async move { lost.await.into() }
}

pub(crate) fn lease_deadline(guard: &LockGuard) -> Instant {
    guard.session().lease_deadline()
}
