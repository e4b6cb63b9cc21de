//! etcd locks: a lease kept alive every TTL/3, and etcd's own lock layout
//! (the `concurrency.Mutex` recipe the v3lock service runs): a key
//! `NAME/LEASE` attached to the session's lease, the holder being the key
//! with the lowest create revision under `NAME/`. Interoperates with
//! `etcdctl lock NAME` and every other client of that recipe.
//!
//! - blocking acquire: the `Lock` RPC (the server creates the key and waits
//!   for the older ones to go; FIFO by create revision); a wait given up
//!   deletes the key, in case the grant raced the timeout;
//! - try: the recipe by hand: create the key if absent, read the first
//!   key by create revision, and delete ours again if it is not first;
//! - the token is the key's create revision. A later holder's key was
//!   created after every older holder's key existed, so tokens strictly
//!   increase; the revision is replicated by etcd's Raft log and survives
//!   crashes and leader changes: a real fencing token;
//! - the lease ends the lock: a holder that stops renewing (crash, pause,
//!   partition) loses it within the lease TTL, which etcd counts on the
//!   leader and restarts in full after a leader change.
//!
//! A caveat of the layout: a lock `a` sees the keys of a lock `a/b`
//! (`a/b/LEASE` starts with `a/`), so slash-separated names nest into false
//! contention; use names without `/` or without a common prefix.

use crate::lease::{watchdog, Lease, Renewal};
use crate::{Error, Lost, Token};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    LockOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// How long connecting and each non-blocking request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub(crate) struct Locker {
    endpoints: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    lease_id: i64,
    lease: Lease,
    watchdog: AbortHandle,
    endpoints: String,
    /// Set by [`Session::close`], so dropping does not revoke again.
    revoked: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("etcd::Session")
            .field("endpoints", &self.endpoints)
            .field("lease_id", &self.lease_id)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watchdog.abort();
        self.lease.end(Lost::Closed);
        if self.revoked.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // Revoking frees every key of the session now rather than at expiry.
        let (mut client, id) = (self.client.clone(), self.lease_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, client.lease_revoke(id)).await;
            });
        }
    }
}

/// The keep-alive stream of a lease, opened again after it broke.
struct KeepAlive {
    client: Client,
    id: i64,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl KeepAlive {
    async fn renew(&mut self) -> Result<Renewal, Error> {
        let sent = Instant::now();
        let answer = self.exchange().await;
        if answer.is_err() {
            self.stream = None;
        }
        match answer? {
            0 => Ok(Renewal::Gone(format!("etcd lease {:x} expired", self.id))),
            ttl => Ok(Renewal::Until(
                sent + Duration::from_secs(ttl.unsigned_abs()),
            )),
        }
    }

    async fn exchange(&mut self) -> Result<i64, Error> {
        if self.stream.is_none() {
            match self.client.lease_keep_alive(self.id).await {
                Ok(opened) => self.stream = Some(opened),
                // Opening sends a first keepalive, and the library turns
                // etcd's TTL 0 (no such lease) into this error.
                Err(etcd_client::Error::LeaseKeepAliveError(why)) if why == "lease not found" => {
                    return Ok(0)
                }
                Err(err) => return Err(unreachable(err)),
            }
        }
        let (keeper, stream) = self.stream.as_mut().expect("opened above");
        keeper.keep_alive().await.map_err(unreachable)?;
        match stream.message().await.map_err(unreachable)? {
            Some(answer) => Ok(answer.ttl()),
            None => Err(unreachable("the keep-alive stream ended")),
        }
    }
}

fn unreachable(cause: impl std::fmt::Display) -> Error {
    Error::unavailable("etcd", cause)
}

impl Locker {
    pub(crate) fn new(endpoints: Vec<String>) -> Locker {
        Locker { endpoints }
    }

    /// Connects and grants the session's lease: `ttl` rounded up to whole
    /// seconds (etcd's unit), or the server's minimum if that is longer.
    pub(crate) async fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        let endpoints = self.endpoints.join(",");
        let options = ConnectOptions::new().with_connect_timeout(REQUEST_TIMEOUT);
        let mut client = tokio::time::timeout(
            REQUEST_TIMEOUT,
            Client::connect(&self.endpoints, Some(options)),
        )
        .await
        .map_err(|_| Error::unavailable(&endpoints, "no connection within 5s"))?
        .map_err(|err| Error::unavailable(&endpoints, err))?;
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000).max(1))
            .map_err(|_| Error::invalid(format!("TTL {ttl:?} is too long for etcd")))?;
        let sent = Instant::now();
        let granted = tokio::time::timeout(REQUEST_TIMEOUT, client.lease_grant(seconds, None))
            .await
            .map_err(|_| Error::unavailable(&endpoints, "no lease granted within 5s"))?
            .map_err(|err| Error::unavailable(&endpoints, err))?;
        let ttl = Duration::from_secs(granted.ttl().unsigned_abs());
        let lease = Lease::new(sent + ttl);
        let keep_alive = Arc::new(Mutex::new(KeepAlive {
            client: client.clone(),
            id: granted.id(),
            stream: None,
        }));
        let watchdog = tokio::spawn(watchdog(lease.clone(), ttl / 3, move || {
            let keep_alive = keep_alive.clone();
            async move { keep_alive.lock().await.renew().await }
        }))
        .abort_handle();
        Ok(Session {
            inner: Arc::new(Inner {
                client,
                lease_id: granted.id(),
                lease,
                watchdog,
                endpoints,
                revoked: Default::default(),
            }),
        })
    }
}

/// A held etcd lock: its key and that key's create revision.
#[derive(Debug)]
pub(crate) struct Held {
    session: Session,
    key: String,
    revision: i64,
}

impl Session {
    fn key(&self, name: &str) -> String {
        format!("{name}/{:x}", self.inner.lease_id)
    }

    fn client(&self) -> Client {
        self.inner.client.clone()
    }

    fn failed(&self, err: etcd_client::Error) -> Error {
        Error::unavailable(&self.inner.endpoints, err)
    }

    fn held(&self, key: String, revision: i64) -> (Held, Token) {
        let token = Token::Fencing(revision.unsigned_abs());
        let session = self.clone();
        (
            Held {
                session,
                key,
                revision,
            },
            token,
        )
    }

    /// The recipe's try-lock: our key, then whether it is the oldest.
    pub(crate) async fn try_acquire(&self, name: &str) -> Result<Option<(Held, Token)>, Error> {
        let key = self.key(name);
        let mut client = self.client();
        let create = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(self.inner.lease_id)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let created = within(client.txn(create))
            .await?
            .map_err(|err| self.failed(err))?;
        let revision = if created.succeeded() {
            created.header().map_or(0, |header| header.revision())
        } else {
            match created.op_responses().first() {
                Some(TxnOpResponse::Get(get)) => {
                    get.kvs().first().map_or(0, |kv| kv.create_revision())
                }
                _ => 0,
            }
        };
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let oldest = within(client.get(format!("{name}/"), Some(first)))
            .await?
            .map_err(|err| self.failed(err))?;
        if oldest
            .kvs()
            .first()
            .is_some_and(|kv| kv.key() == key.as_bytes())
            && revision > 0
        {
            return Ok(Some(self.held(key, revision)));
        }
        within(client.delete(key.as_str(), None))
            .await?
            .map_err(|err| self.failed(err))?;
        Ok(None)
    }

    /// The `Lock` RPC, waiting on the server until `give_up`.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        give_up: Option<Instant>,
    ) -> Result<(Held, Token), Error> {
        let mut client = self.client();
        let options = LockOptions::new().with_lease(self.inner.lease_id);
        let waited = Instant::now();
        let locking = client.lock(name, Some(options));
        let answer = tokio::select! {
            answer = locking => answer.map_err(|err| self.failed(err))?,
            reason = self.inner.lease.lost(Duration::ZERO) => {
                return Err(Error::lost(name, reason));
            }
            () = sleep_until_set(give_up) => {
                // The grant may have raced the timeout: our key goes either way.
                let _ = within(client.delete(self.key(name), None)).await;
                return Err(Error::timed_out(name, waited.elapsed()));
            }
        };
        let key = String::from_utf8_lossy(answer.key()).into_owned();
        let read = within(client.get(key.as_str(), None))
            .await?
            .map_err(|err| self.failed(err))?;
        match read.kvs().first() {
            Some(kv) => Ok(self.held(key, kv.create_revision())),
            None => Err(Error::lost(
                name,
                "its key was gone as soon as it was granted (the lease expired)",
            )),
        }
    }

    pub(crate) fn lease(&self) -> &Lease {
        &self.inner.lease
    }

    /// Revokes the lease, which deletes every key of the session at once.
    pub(crate) async fn close(&self) -> Result<(), Error> {
        let inner = &self.inner;
        inner.watchdog.abort();
        inner.lease.end(Lost::Closed);
        let mut client = self.client();
        let revoked = within(client.lease_revoke(inner.lease_id)).await?;
        inner
            .revoked
            .store(true, std::sync::atomic::Ordering::Relaxed);
        match revoked {
            Ok(_) => Ok(()),
            // Already gone (expired): closed all the same.
            Err(etcd_client::Error::GRpcStatus(status))
                if status.code() == tonic::Code::NotFound =>
            {
                Ok(())
            }
            Err(err) => Err(self.failed(err)),
        }
    }
}

impl Held {
    pub(crate) fn lease(&self) -> &Lease {
        self.session.lease()
    }

    /// Deletes the key only if it is still the one granted.
    pub(crate) async fn release(self, name: &str) -> Result<(), Error> {
        let delete = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([TxnOp::delete(self.key.as_str(), None)]);
        let mut client = self.session.client();
        let answer = within(client.txn(delete))
            .await?
            .map_err(|err| self.session.failed(err))?;
        if answer.succeeded() {
            Ok(())
        } else {
            Err(Error::lost(
                name,
                "its key is gone (the lease expired or was revoked)",
            ))
        }
    }
}

/// A non-blocking etcd request, cut off after [`REQUEST_TIMEOUT`].
async fn within<T>(request: impl std::future::Future<Output = T>) -> Result<T, Error> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| unreachable(format!("no answer within {REQUEST_TIMEOUT:?}")))
}

/// Sleeps until `at`; never wakes when it is `None`.
async fn sleep_until_set(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
