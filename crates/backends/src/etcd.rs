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
//! - elections are etcd's own v3election service (`Campaign`, `Proclaim`,
//!   `Leader`; resigning is the release's compare-and-delete, which is what
//!   its `Resign` does): the same layout, with the leader's value in its
//!   key, so `etcdctl elect NAME` campaigns in the same queue;
//! - the lease ends the lock: a holder that stops renewing (crash, pause,
//!   partition) loses it within the lease TTL, which etcd counts on the
//!   leader and restarts in full after a leader change.
//!
//! Each member gets a client of its own, and requests go to one member until
//! it cannot be reached, then to the next ([`Members`]): etcd-client's own
//! balancing over several endpoints kept sending to a killed leader in our
//! tests, and the lease expired behind it.
//!
//! Authentication (`etcd://USER:PASSWORD@…`) and TLS (`etcds://`) are
//! etcd-client's own `ConnectOptions`: a token fetched at connect, sent with
//! every request; tonic's rustls. A refused user or certificate is
//! `Refused` (no retry), with the fix named.
//!
//! A caveat of the layout: a lock `a` sees the keys of a lock `a/b`
//! (`a/b/LEASE` starts with `a/`), so slash-separated names nest into false
//! contention; use names without `/` or without a common prefix.

use crate::lease::{watchdog, Lease, Renewal};
use crate::target::{EtcdTls, Secret};
use crate::{Error, ErrorKind, Leader, Lost, Token};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaderKey,
    LeaseKeepAliveStream, LeaseKeeper, LockOptions, ProclaimOptions, PutOptions, SortOrder,
    SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// How long connecting and each non-blocking request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// etcd's `ErrElectionNoLeader` and `ErrElectionNotLeader` (v3election).
const NO_LEADER: &str = "election: no leader";
const NOT_LEADER: &str = "election: not leader";

/// One client per member, and which one requests go to.
struct Members {
    clients: Vec<Client>,
    current: AtomicUsize,
    endpoints: String,
}

impl Members {
    /// Clients connect lazily: a member that is down now is skipped later.
    async fn connect(endpoints: &[String], access: &Access) -> Result<Members, Error> {
        let all = endpoints.join(",");
        let mut clients = Vec::new();
        for endpoint in endpoints {
            let mut options = ConnectOptions::new().with_connect_timeout(REQUEST_TIMEOUT);
            if let Some((user, password)) = &access.user {
                options = options.with_user(user, password.expose());
            }
            if let Some(tls) = &access.tls {
                options = options.with_tls(tls.clone());
            }
            let client = within(Client::connect([endpoint], Some(options)))
                .await?
                .map_err(|err| connect_failure(endpoint, &err))?;
            clients.push(client);
        }
        Ok(Members {
            clients,
            current: AtomicUsize::new(0),
            endpoints: all,
        })
    }

    /// The member requests go to now, and its client.
    fn current(&self) -> (usize, Client) {
        let at = self.current.load(Ordering::Relaxed) % self.clients.len();
        (at, self.clients[at].clone())
    }

    /// `at` could not be reached: move on to the next member, unless
    /// another request already did.
    fn failed(&self, at: usize) {
        let next = (at + 1) % self.clients.len();
        let _ = self
            .current
            .compare_exchange(at, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs a non-blocking request on the current member, and on the next
    /// ones while members cannot be reached (each member once).
    async fn call<T, Fut>(&self, request: impl Fn(Client) -> Fut) -> Result<T, Error>
    where
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = None;
        for _ in 0..self.clients.len() {
            let (at, client) = self.current();
            match within(request(client)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(err)) if !unreachable_member(&err) => return Err(self.error(err)),
                Ok(Err(err)) => last = Some(self.error(err)),
                Err(timeout) => last = Some(timeout),
            }
            self.failed(at);
        }
        Err(last.expect("at least one member"))
    }

    /// The caller's error: `Unavailable` (worth another try) when no member
    /// could be reached, `Refused` for what a member said no to.
    fn error(&self, err: etcd_client::Error) -> Error {
        if let Some(refused) = tls_refusal(&self.endpoints, &err.to_string()) {
            return refused;
        }
        if unreachable_member(&err) {
            Error::unavailable(&self.endpoints, err)
        } else {
            Error::new(
                ErrorKind::Refused,
                format!("etcd at {} refused: {err}", self.endpoints),
            )
        }
    }
}

/// A connection that failed: `Refused` (waiting will not help) when etcd
/// refused the user or the TLS handshake failed on the certificate,
/// `Unavailable` otherwise. Says the whole chain of causes: tonic's own
/// message is only "transport error".
fn connect_failure(endpoint: &str, err: &etcd_client::Error) -> Error {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(inner) = cause {
        text = format!("{text}: {inner}");
        cause = inner.source();
    }
    if let etcd_client::Error::GRpcStatus(status) = err {
        if matches!(
            status.code(),
            tonic::Code::InvalidArgument
                | tonic::Code::Unauthenticated
                | tonic::Code::PermissionDenied
                | tonic::Code::FailedPrecondition
        ) {
            return Error::new(
                ErrorKind::Refused,
                format!("etcd at {endpoint} refused us ({text}); check the URL's USER:PASSWORD@"),
            );
        }
    }
    tls_refusal(endpoint, &text).unwrap_or_else(|| Error::unavailable(endpoint, text))
}

/// The error of a TLS handshake that failed on the member's certificate
/// (at connect or, the connection being lazy, at the first request).
fn tls_refusal(endpoint: &str, text: &str) -> Option<Error> {
    (text.contains("certificate") || text.contains("UnknownIssuer")).then(|| {
        Error::new(
            ErrorKind::Refused,
            format!(
                "etcd at {endpoint}: the TLS handshake failed ({text}); give the CA that signed \
                 the member's certificate as ?ca=PATH"
            ),
        )
    })
}

/// Whether an error says the member is out of reach (not a refusal).
fn unreachable_member(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Locker {
    endpoints: Vec<String>,
    access: Access,
}

/// Who we are to etcd, and how its certificate is checked.
#[derive(Clone)]
struct Access {
    user: Option<(String, Secret)>,
    tls: Option<TlsOptions>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("user", &self.user) // the password is a `Secret`: ***
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    members: Arc<Members>,
    lease_id: i64,
    lease: Lease,
    watchdog: AbortHandle,
    /// Set by [`Session::close`], so dropping does not revoke again.
    revoked: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("etcd::Session")
            .field("endpoints", &self.members.endpoints)
            .field("lease_id", &self.lease_id)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watchdog.abort();
        self.lease.end(Lost::Closed);
        if self.revoked.load(Ordering::Relaxed) {
            return;
        }
        // Revoking frees every key of the session now rather than at expiry.
        let (mut client, id) = (self.members.current().1, self.lease_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, client.lease_revoke(id)).await;
            });
        }
    }
}

/// The keep-alive stream of a lease, opened again after it broke.
struct KeepAlive {
    members: Arc<Members>,
    id: i64,
    /// The open stream and the member it goes to.
    stream: Option<(usize, LeaseKeeper, LeaseKeepAliveStream)>,
    /// The member of an exchange under way; still set when the next one
    /// starts if that exchange was cut off, which counts against the member.
    pending: Option<usize>,
}

impl KeepAlive {
    async fn renew(&mut self) -> Result<Renewal, Error> {
        let sent = Instant::now();
        match self.exchange().await? {
            0 => Ok(Renewal::Gone(format!("etcd lease {:x} expired", self.id))),
            ttl => Ok(Renewal::Until(
                sent + Duration::from_secs(ttl.unsigned_abs()),
            )),
        }
    }

    /// One keepalive and its answer. The stream is taken out for the
    /// exchange and put back only after an answer: an exchange cut off
    /// half-way (the watchdog gives each attempt a third of the TTL, and a
    /// stream to a member that died may never answer) leaves no stale
    /// stream behind, and its member is passed over by the next attempt.
    async fn exchange(&mut self) -> Result<i64, Error> {
        if let Some(cut_off) = self.pending.take() {
            self.members.failed(cut_off);
        }
        let (at, mut keeper, mut stream) = match self.stream.take() {
            Some(open) => open,
            None => {
                let (at, mut client) = self.members.current();
                self.pending = Some(at);
                match client.lease_keep_alive(self.id).await {
                    Ok((keeper, stream)) => (at, keeper, stream),
                    // Opening sends a first keepalive, and the library turns
                    // etcd's TTL 0 (no such lease) into this error.
                    Err(etcd_client::Error::LeaseKeepAliveError(why))
                        if why == "lease not found" =>
                    {
                        self.pending = None;
                        return Ok(0);
                    }
                    Err(err) => {
                        self.pending = None;
                        self.members.failed(at);
                        return Err(unreachable(err));
                    }
                }
            }
        };
        self.pending = Some(at);
        let answer = match keeper.keep_alive().await {
            Ok(()) => stream.message().await,
            Err(err) => Err(err),
        };
        self.pending = None;
        match answer {
            Ok(Some(answer)) => {
                self.stream = Some((at, keeper, stream));
                Ok(answer.ttl())
            }
            Ok(None) => {
                self.members.failed(at);
                Err(unreachable("the keep-alive stream ended"))
            }
            Err(err) => {
                self.members.failed(at);
                Err(unreachable(err))
            }
        }
    }
}

fn unreachable(cause: impl std::fmt::Display) -> Error {
    Error::unavailable("etcd", cause)
}

impl Locker {
    /// The CA file of `tls` is read here, so that a missing one is refused
    /// before anything connects.
    pub(crate) fn new(
        endpoints: Vec<String>,
        user: Option<(String, Secret)>,
        tls: Option<EtcdTls>,
    ) -> Result<Locker, Error> {
        let tls = match tls {
            None => None,
            Some(EtcdTls { ca: None }) => Some(TlsOptions::new().with_native_roots()),
            Some(EtcdTls { ca: Some(ca) }) => {
                let pem = std::fs::read(&ca).map_err(|err| {
                    Error::invalid(format!(
                        "etcd: cannot read the CA file {} (?ca=): {err}",
                        ca.display()
                    ))
                })?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(Error::invalid(format!(
                        "etcd: the CA file {} (?ca=) holds no PEM certificate",
                        ca.display()
                    )));
                }
                Some(TlsOptions::new().ca_certificate(Certificate::from_pem(pem)))
            }
        };
        Ok(Locker {
            endpoints,
            access: Access { user, tls },
        })
    }

    /// The current leader of the election `name` (etcd's `Leader` RPC).
    pub(crate) async fn leader(&self, name: &str) -> Result<Option<Leader>, Error> {
        let members = Members::connect(&self.endpoints, &self.access).await?;
        let asked = members
            .call(|mut client| async move {
                match client.leader(name).await {
                    Ok(answer) => Ok(answer.kv().map(|kv| Leader {
                        value: String::from_utf8_lossy(kv.value()).into_owned(),
                        token: Token::Fencing(kv.create_revision().unsigned_abs()),
                    })),
                    Err(etcd_client::Error::GRpcStatus(status))
                        if status.message().contains(NO_LEADER) =>
                    {
                        Ok(None)
                    }
                    Err(err) => Err(err),
                }
            })
            .await?;
        Ok(asked)
    }

    /// Connects and grants the session's lease: `ttl` rounded up to whole
    /// seconds (etcd's unit), or the server's minimum if that is longer.
    pub(crate) async fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        let members = Arc::new(Members::connect(&self.endpoints, &self.access).await?);
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000).max(1))
            .map_err(|_| Error::invalid(format!("TTL {ttl:?} is too long for etcd")))?;
        let sent = Instant::now();
        let granted = members
            .call(|mut client| async move { client.lease_grant(seconds, None).await })
            .await?;
        let ttl = Duration::from_secs(granted.ttl().unsigned_abs());
        let lease = Lease::new(sent + ttl);
        let keep_alive = Arc::new(Mutex::new(KeepAlive {
            members: members.clone(),
            id: granted.id(),
            stream: None,
            pending: None,
        }));
        let watchdog = tokio::spawn(watchdog(lease.clone(), ttl / 3, move || {
            let keep_alive = keep_alive.clone();
            async move { keep_alive.lock().await.renew().await }
        }))
        .abort_handle();
        Ok(Session {
            inner: Arc::new(Inner {
                members,
                lease_id: granted.id(),
                lease,
                watchdog,
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

    fn members(&self) -> &Members {
        &self.inner.members
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
        let create = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(self.inner.lease_id)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let created = self
            .members()
            .call(|mut client| {
                let create = create.clone();
                async move { client.txn(create).await }
            })
            .await?;
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
        let prefix = format!("{name}/");
        let oldest = self
            .members()
            .call(|mut client| {
                let (prefix, first) = (prefix.clone(), first.clone());
                async move { client.get(prefix, Some(first)).await }
            })
            .await?;
        if oldest
            .kvs()
            .first()
            .is_some_and(|kv| kv.key() == key.as_bytes())
            && revision > 0
        {
            return Ok(Some(self.held(key, revision)));
        }
        self.delete(&key).await?;
        Ok(None)
    }

    async fn delete(&self, key: &str) -> Result<(), Error> {
        self.members()
            .call(|mut client| async move { client.delete(key, None).await })
            .await
            .map(drop)
    }

    /// The `Lock` RPC, waiting on the server until `give_up`.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        give_up: Option<Instant>,
    ) -> Result<(Held, Token), Error> {
        let options = LockOptions::new().with_lease(self.inner.lease_id);
        let answer = self
            .wait_on_server(name, give_up, |mut client| {
                let options = options.clone();
                async move { client.lock(name, Some(options)).await }
            })
            .await?;
        let key = String::from_utf8_lossy(answer.key()).into_owned();
        let read = self
            .members()
            .call(|mut client| {
                let key = key.clone();
                async move { client.get(key, None).await }
            })
            .await?;
        match read.kvs().first() {
            Some(kv) => Ok(self.held(key, kv.create_revision())),
            None => Err(Error::lost(
                name,
                "its key was gone as soon as it was granted (the lease expired)",
            )),
        }
    }

    /// The `Campaign` RPC of etcd's v3election service, waiting on the
    /// server until `give_up`: the leader key is `NAME/LEASE` with `value`,
    /// and leads while it is the oldest under `NAME/` (FIFO by create
    /// revision, the lock's layout). Its create revision is the term and
    /// the fencing token.
    pub(crate) async fn campaign(
        &self,
        name: &str,
        value: &str,
        give_up: Option<Instant>,
    ) -> Result<(Held, Token), Error> {
        let lease = self.inner.lease_id;
        let answer = self
            .wait_on_server(name, give_up, |mut client| async move {
                client.campaign(name, value, lease).await
            })
            .await?;
        match answer.leader() {
            Some(leader) => Ok(self.held(
                String::from_utf8_lossy(leader.key()).into_owned(),
                leader.rev(),
            )),
            None => Err(Error::lost(name, "etcd elected no leader key")),
        }
    }

    /// Waits for the grant `rpc` asks the server for (the `Lock` or the
    /// `Campaign` RPC) until `give_up`, or until the session's lease is
    /// lost; on another member if this one cannot be reached (each member
    /// once). A wait given up deletes our key, in case the grant raced it.
    async fn wait_on_server<T, Fut>(
        &self,
        name: &str,
        give_up: Option<Instant>,
        rpc: impl Fn(Client) -> Fut,
    ) -> Result<T, Error>
    where
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let waited = Instant::now();
        let mut tries = self.members().clients.len();
        loop {
            let (at, client) = self.members().current();
            tokio::select! {
                answer = rpc(client) => match answer {
                    Ok(answer) => return Ok(answer),
                    Err(err) if unreachable_member(&err) && tries > 1 => {
                        tries -= 1;
                        self.members().failed(at);
                    }
                    Err(err) => return Err(self.members().error(err)),
                },
                reason = self.inner.lease.lost(Duration::ZERO) => {
                    return Err(Error::lost(name, reason));
                }
                () = sleep_until_set(give_up) => {
                    let _ = self.delete(&self.key(name)).await;
                    return Err(Error::timed_out(name, waited.elapsed()));
                }
            }
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
        let id = inner.lease_id;
        let revoked = self
            .members()
            .call(|mut client| async move {
                match client.lease_revoke(id).await {
                    // Already gone (expired): closed all the same.
                    Err(etcd_client::Error::GRpcStatus(status))
                        if status.code() == tonic::Code::NotFound =>
                    {
                        Ok(())
                    }
                    revoked => revoked.map(drop),
                }
            })
            .await;
        inner.revoked.store(true, Ordering::Relaxed);
        revoked
    }
}

impl Held {
    pub(crate) fn lease(&self) -> &Lease {
        self.session.lease()
    }

    /// etcd's `Proclaim` RPC: the leader key's value becomes `value`, if
    /// the key is still the one elected (its create revision; otherwise
    /// nothing changes and leadership is lost).
    pub(crate) async fn proclaim(&self, name: &str, value: &str) -> Result<(), Error> {
        let leader = LeaderKey::new()
            .with_name(name)
            .with_key(self.key.as_str())
            .with_rev(self.revision)
            .with_lease(self.session.inner.lease_id);
        let proclaimed = self
            .session
            .members()
            .call(|mut client| {
                let options = ProclaimOptions::new().with_leader(leader.clone());
                async move {
                    match client.proclaim(value, Some(options)).await {
                        Err(etcd_client::Error::GRpcStatus(status))
                            if status.message().contains(NOT_LEADER) =>
                        {
                            Ok(false)
                        }
                        proclaimed => proclaimed.map(|_| true),
                    }
                }
            })
            .await?;
        if proclaimed {
            Ok(())
        } else {
            Err(Error::lost(
                name,
                "its leader key is gone (the lease expired or was revoked)",
            ))
        }
    }

    /// Deletes the key only if it is still the one granted (for a leader
    /// key, what etcd's `Resign` does).
    pub(crate) async fn release(self, name: &str) -> Result<(), Error> {
        let delete = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([TxnOp::delete(self.key.as_str(), None)]);
        let answer = self
            .session
            .members()
            .call(|mut client| {
                let delete = delete.clone();
                async move { client.txn(delete).await }
            })
            .await?;
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
