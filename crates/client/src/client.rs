//! [`Client`]: a connection to a Deadbolt cluster and one method per API call.
//!
//! The plain methods here make exactly one request each and leave retrying
//! to the caller; they are what the CLI uses when a session or lock outlives
//! the process that took it. [`Session`] builds leases, renewal and retries
//! on top of them.
//!
//! The client keeps every endpoint it was given. It talks to one at a time
//! and moves on to the next when a call finds that one unreachable or not the
//! leader, so a later call lands elsewhere. A node that is not the leader
//! names the one that is, and the client goes there even when it was not
//! given that address (a cluster grown since, or one endpoint given): as
//! with etcd or Consul, any member is a way in. It keeps one such address
//! at a time, so nothing accumulates.
//!
//! Its length (about 1,420 lines without its tests) is `Client`: one public
//! method per call of the API (most a few lines) on top of the one retry loop
//! (`call_over`) every call goes through, whose rules are what this file is
//! about.

use crate::backoff::{Backoff, BASE, FAILOVER_CAP};
use crate::calls::Calls;
use crate::error::{describe_chain, tls_hint};
use crate::framed::{FramedTls, Framing};
use crate::link::{Authorization, Link, CONNECT_TIMEOUT};
use crate::simulation::Dial;
use crate::{Error, ErrorKind, HealthResponse, LockState, RwMode, Session, SessionHandle};
use deadbolt_proto::v1::access_client::AccessClient;
use deadbolt_proto::v1::call_request::Call;
use deadbolt_proto::v1::call_response::Result as Answer;
use deadbolt_proto::v1::cluster_client::ClusterClient;
use deadbolt_proto::v1::deadbolt_client::DeadboltClient;
use deadbolt_proto::v1::{
    AclBootstrapRequest, AclCreateTokenRequest, AclDeleteRoleRequest, AclGrant, AclIdentityName,
    AclRevokeTokenRequest, AclRole, AclRoleBinding, AclShowRequest, AclShowResponse,
    AclTokenResponse, AcquirePermitsRequest, AcquireRequest, AddMemberRequest, AuditEntry,
    CampaignRequest, CheckTokenRequest, CloseSessionRequest, ClusterStatusRequest,
    ClusterStatusResponse, DefineSemaphoreRequest, DeleteSemaphoreRequest, HealthRequest,
    KeepAliveRequest, LeaderRequest, LeaderResponse, LimitsRequest, LimitsResponse,
    ListLocksRequest, LockHistoryRequest, LockStatusRequest, OpenSessionRequest, Permit,
    ProclaimRequest, ReleaseRequest, RemoveMemberRequest, SemaphoreState, SemaphoreStatusRequest,
    SetLimitsRequest, StoreDeleteRequest, StoreGetRequest, StorePutRequest, WhoAmIRequest,
    WhoAmIResponse,
};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A blocking `Acquire` can sit on one connection indefinitely; HTTP/2 pings
/// notice when the peer has silently gone, so the call fails and is retried
/// instead of hanging.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one call keeps trying while its endpoint is down, a leader is
/// being elected, or a forwarding node lost its leader. A failover takes
/// 0.5-0.7 s at the default election timeout, and a forwarding node waits up
/// to 2 s for one (`forward.rs`), so 10 s rides through several in a row,
/// like the Python and TypeScript clients' call timeout. Calls with a
/// deadline of their own (a lock wait, a lease) stop at that instead.
pub(crate) const FAILOVER_BUDGET: Duration = Duration::from_secs(10);

/// Pause before asking again when no node knows a leader (an election is
/// under way; it normally takes a few hundred milliseconds).
const ELECTION_PAUSE: Duration = Duration::from_millis(50);
/// How long a call of a session's own retry loop (see [`Patience::Search`])
/// goes on from node to node before its loop takes over.
const LEADER_SEARCH: Duration = Duration::from_secs(2);

/// How long one call keeps looking for a node that serves it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// Straight on to where a failure points (a leader named, the next
    /// endpoint), for up to [`LEADER_SEARCH`]; a failure with nowhere else
    /// to go goes back to the caller. For the session's calls (acquire,
    /// release, keepalive): the session's own retry loop paces them, and
    /// stops at their own deadline (a lock's wait, the lease), which a
    /// longer search here would overrun (found: `lock_timeout(500ms)`
    /// waited out a server's whole restart).
    Search,
    /// Also after a pause, with backoff, for up to [`FAILOVER_BUDGET`]: a
    /// call with no deadline of its own.
    Budget,
}

/// When a call that failed may be sent again elsewhere.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Only if it certainly had no effect (refused by a follower, or never
    /// sent): a change that repeated could do something twice
    /// (`cluster add` after an election, for one).
    IfUnsent,
    /// After any failure that points elsewhere: a read, which changes
    /// nothing.
    Freely,
    /// After any failure that points elsewhere too: a change whose repeat
    /// does nothing more (see [`Client::open_session_raw`],
    /// [`Client::store_put`]). But a refusal of the repeat does not say the
    /// first attempt did nothing (a fenced put that went through, then
    /// refused as stale once a newer holder fenced the key): after an
    /// attempt of unknown outcome, a refusal is reported as `unavailable`,
    /// the outcome unknown (found by the simulation, seed 190: a counter
    /// one above its acknowledged increments).
    Idempotent,
}

/// A fenced-store key's value and fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// `None`: never set, or deleted.
    pub value: Option<String>,
    /// The highest token the key has accepted; 0 if none.
    pub fence: u64,
}

/// A handle on a Deadbolt cluster. Cheap to clone; clones share connections.
#[derive(Debug, Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The endpoints given, in order.
    targets: Vec<Target>,
    /// How they are dialled, for a leader a node names outside them.
    tls: TlsOptions,
    current: Mutex<Current>,
    authorization: Authorization,
    /// Whether to follow the leader a forwarding node names on a
    /// successful answer (see [`Client::follow_hint`]): until a leader
    /// reached that way could not be connected to.
    follow_hints: AtomicBool,
    /// Connections through the simulation's network instead of TCP.
    dial: Option<Dial>,
    /// Whether the `Calls` stream may go as framed calls.
    framing: Framing,
}

/// How to reach `https://` endpoints: the CA that signed the servers'
/// certificates and, for servers that require client certificates (mTLS),
/// this client's own certificate and key. PEM files, as `deadbolt certs`
/// writes them or any PKI issues them.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    config: Option<ClientTlsConfig>,
    /// The same, for framed calls (`framed.rs`); `None` if rustls cannot
    /// use the files, which gRPC then reports.
    framed: Option<Arc<FramedTls>>,
}

impl TlsOptions {
    /// Reads the files; an error names the one that could not be read.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<TlsOptions, Error> {
        let read = |path: &Path, what: &str| {
            std::fs::read(path).map_err(|err| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("cannot read the {what} {}: {err}", path.display()),
                )
            })
        };
        let mut config = ClientTlsConfig::new();
        let Some(ca) = ca else {
            if cert.is_some() || key.is_some() {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "--cert and --key need --ca too (the CA that signed the server's certificate)",
                ));
            }
            return Ok(TlsOptions::default());
        };
        let ca = read(ca, "CA certificate")?;
        config = config.ca_certificate(Certificate::from_pem(&ca));
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => {
                let identity = (read(cert, "client certificate")?, read(key, "client key")?);
                config = config.identity(Identity::from_pem(&identity.0, &identity.1));
                Some(identity)
            }
            (None, None) => None,
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "a client certificate needs both --cert and --key",
                ))
            }
        };
        let identity = identity.as_ref().map(|(cert, key)| (&cert[..], &key[..]));
        Ok(TlsOptions {
            config: Some(config),
            framed: crate::framed::tls_config(&ca, identity),
        })
    }
}

/// One server address, as given (normalised) and ready to dial.
#[derive(Debug)]
struct Target {
    address: String,
    endpoint: Endpoint,
}

/// The endpoint calls go to now.
#[derive(Debug)]
pub(crate) struct Current {
    /// How far the search for a leader has come through the endpoints
    /// given: the one calls go to, or the one that named the leader they go
    /// to. Only a failure that names no leader moves it on.
    index: usize,
    /// Where calls go: `targets[index]`, or a leader that endpoint named
    /// (one of the endpoints given, or an address outside them).
    address: Arc<str>,
    /// Bumped on every switch, so that many calls failing together move
    /// the client on by one endpoint rather than one each.
    generation: u64,
    channel: Link,
    /// The `Calls` stream on `channel`, opened on first use.
    calls: Option<Calls>,
    /// Reached by following the leader a forwarding node named.
    hinted: bool,
    /// Set once this endpoint turned framed calls away (`framed.rs`).
    framed_refused: Arc<AtomicBool>,
}

impl Current {
    fn new(index: usize, address: &str, generation: u64, channel: Link) -> Current {
        Current {
            index,
            address: address.into(),
            generation,
            channel,
            calls: None,
            hinted: false,
            framed_refused: Arc::default(),
        }
    }

    pub(crate) fn channel(&mut self) -> Link {
        self.channel.clone()
    }

    /// The `Calls` stream, opening a new one if there is none or it ended:
    /// as framed calls if `framed` and the endpoint has not refused them.
    fn calls(&mut self, framed: &Framing) -> Calls {
        if let Some(calls) = self.calls.as_ref().filter(|calls| !calls.has_ended()) {
            return calls.clone();
        }
        let framed = framed.target(&self.address, &self.framed_refused);
        self.calls
            .insert(Calls::open(self.channel.clone(), framed))
            .clone()
    }
}

impl Client {
    /// Connects to the first of `endpoints` that answers. An endpoint is a
    /// URL such as `http://127.0.0.1:7070`; a bare `host:port` means
    /// `http://host:port`, and a bare `host` `http://host:7070`. For
    /// `https://` endpoints, see [`Client::connect_with`]. One node of a
    /// cluster is enough (calls a follower refuses go on to the leader it
    /// names); every node's address lets the client in while one is down.
    pub async fn connect(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Client, Error> {
        Self::connect_with(endpoints, &TlsOptions::default()).await
    }

    /// [`Client::connect`], with TLS for `https://` endpoints (bare
    /// addresses then mean `https://` too).
    pub async fn connect_with(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        tls: &TlsOptions,
    ) -> Result<Client, Error> {
        Self::connect_with_token(endpoints, tls, None).await
    }

    /// [`Client::connect_with`], sending `token` (from `deadbolt acl token
    /// create`) with every call, for a cluster with access control on.
    pub async fn connect_with_token(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        tls: &TlsOptions,
        token: Option<&str>,
    ) -> Result<Client, Error> {
        Self::connect_dialling(endpoints, tls, token, None).await
    }

    /// [`Client::connect`] over the deterministic simulation's network:
    /// every connection, to the endpoints given and to leaders they name,
    /// is opened by `dial` (see `deadbolt_client::simulation`).
    #[doc(hidden)]
    pub async fn connect_through(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        dial: Dial,
    ) -> Result<Client, Error> {
        Self::connect_dialling(endpoints, &TlsOptions::default(), None, Some(dial)).await
    }

    async fn connect_dialling(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        tls: &TlsOptions,
        token: Option<&str>,
        dial: Option<Dial>,
    ) -> Result<Client, Error> {
        let authorization = Authorization::bearer(token)?;
        let targets = endpoints
            .into_iter()
            .map(|endpoint| Target::parse(endpoint.into(), tls))
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "no Deadbolt server endpoint given",
            ));
        }
        let mut failures = Vec::new();
        for (index, target) in targets.iter().enumerate() {
            match target.connect(dial.as_ref()).await {
                Ok(channel) => {
                    tracing::debug!(endpoint = %target.address, "connected");
                    let current =
                        Current::new(index, &target.address, 0, authorization.link(channel));
                    let framing =
                        Framing::new(authorization.value(), dial.clone(), tls.framed.clone());
                    return Ok(Client {
                        shared: Arc::new(Shared {
                            current: Mutex::new(current),
                            targets,
                            tls: tls.clone(),
                            authorization,
                            follow_hints: AtomicBool::new(true),
                            dial,
                            framing,
                        }),
                    });
                }
                Err(error) => {
                    tracing::debug!(endpoint = %target.address, %error, "could not connect");
                    let mut failure = format!("{}: {}", target.address, describe_chain(&error));
                    failure.push_str(tls_hint(&failure));
                    failures.push(failure);
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "could not reach the Deadbolt server at {}",
                failures.join("; ")
            ),
        ))
    }

    /// Sends acquires, releases and keepalives over the gRPC `Calls`
    /// stream from now on, never as framed calls (docs/framed-calls.md).
    /// Framed calls, the default, cost the server about a quarter less CPU
    /// per call, and the client falls back to gRPC by itself where a server
    /// or a proxy between does not speak them; this is for comparing the
    /// two, or for a proxy that would pass the preface on to something else.
    pub fn prefer_grpc_calls(&self) {
        self.shared.framing.turn_off();
        self.current().calls = None;
    }

    /// Opens a session whose lease a background task keeps renewing; see
    /// [`Session`]. The server may grant a different TTL than asked for.
    pub async fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        Session::open(self.clone(), ttl).await
    }

    /// Who holds `lock`, and who waits for it; `None` when nobody holds it.
    pub async fn lock_status(&self, lock: &str) -> Result<Option<LockState>, Error> {
        Ok(self.lock_status_with_index(lock).await?.0)
    }

    /// [`lock_status`](Self::lock_status), and the log index of the state
    /// it read: a [`watch`](Self::watch) after that index goes on from it
    /// with no event missed or repeated (how to start again after a
    /// `compacted` watch).
    pub async fn lock_status_with_index(
        &self,
        lock: &str,
    ) -> Result<(Option<LockState>, u64), Error> {
        let request = LockStatusRequest {
            lock: lock.to_owned(),
        };
        let response = self
            .call(Repeat::Freely, request, |channel, request| async move {
                DeadboltClient::new(channel).lock_status(request).await
            })
            .await?;
        Ok((response.state, response.index))
    }

    /// Every held lock, in name order, fetched page by page.
    pub async fn list_locks(&self) -> Result<Vec<LockState>, Error> {
        let mut locks: Vec<LockState> = Vec::new();
        loop {
            let request = ListLocksRequest {
                after: locks
                    .last()
                    .map(|lock| lock.lock.clone())
                    .unwrap_or_default(),
                limit: 0,
            };
            let page = self
                .call(Repeat::Freely, request, |channel, request| async move {
                    DeadboltClient::new(channel).list_locks(request).await
                })
                .await?;
            // An empty page cannot advance `after`; stop rather than ask again.
            let done = !page.more || page.locks.is_empty();
            locks.extend(page.locks);
            if done {
                return Ok(locks);
            }
        }
    }

    /// The answering node's view of itself and the cluster.
    pub async fn health(&self) -> Result<HealthResponse, Error> {
        self.call(
            Repeat::Freely,
            HealthRequest {},
            |channel, request| async move { DeadboltClient::new(channel).health(request).await },
        )
        .await
    }

    /// Opens a session with no renewal: it ends `ttl` after the last
    /// [`keep_alive_raw`](Self::keep_alive_raw). Returns its handle (id and
    /// secret, which every call on the session needs) and the TTL the
    /// server granted.
    pub async fn open_session_raw(
        &self,
        ttl: Duration,
    ) -> Result<(SessionHandle, Duration), Error> {
        let request = OpenSessionRequest {
            ttl_ms: millis(ttl),
        };
        // Repeated even when the first attempt may have been done: at worst
        // that opened a session nobody knows of, which holds nothing and
        // ends by itself one TTL later. Failing the caller instead would turn
        // every leader change into an error (found: `deadbolt run` exited
        // 10 ms after a leader's `kill -9`).
        let response = self
            .call(Repeat::Idempotent, request, |channel, request| async move {
                DeadboltClient::new(channel).open_session(request).await
            })
            .await?;
        Ok((
            SessionHandle::new(response.session_id, response.session_secret),
            Duration::from_millis(response.ttl_ms),
        ))
    }

    /// Renews a session's lease by its TTL (returned), counted from when the
    /// server receives the request.
    pub async fn keep_alive_raw(&self, session: &SessionHandle) -> Result<Duration, Error> {
        let call = || {
            Call::KeepAlive(KeepAliveRequest {
                session_id: session.id(),
                session_secret: session.secret().to_owned(),
            })
        };
        let answer = |answer| match answer {
            Answer::KeepAlive(response) => Some(response),
            _ => None,
        };
        let response = self.call_streamed(call, answer).await?;
        Ok(Duration::from_millis(response.ttl_ms))
    }

    /// Ends a session, releasing every lock it holds.
    pub async fn close_session_raw(&self, session: &SessionHandle) -> Result<(), Error> {
        let request = CloseSessionRequest {
            session_id: session.id(),
            session_secret: session.secret().to_owned(),
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            DeadboltClient::new(channel).close_session(request).await
        })
        .await?;
        Ok(())
    }

    /// Takes `lock` for a session and returns its fencing token. With `wait`
    /// the server queues the request until the lock is free or `timeout`
    /// passes (`None`: no limit); without it a held lock fails with
    /// [`ErrorKind::Busy`]. Repeating a request returns the same grant.
    pub async fn acquire_raw(
        &self,
        session: &SessionHandle,
        lock: &str,
        wait: bool,
        timeout: Option<Duration>,
    ) -> Result<u64, Error> {
        self.acquire_raw_delayed(session, lock, wait, timeout, Duration::ZERO)
            .await
    }

    /// [`acquire_raw`](Self::acquire_raw) with a lock-delay (see
    /// [`Session::set_lock_delay`]).
    pub async fn acquire_raw_delayed(
        &self,
        session: &SessionHandle,
        lock: &str,
        wait: bool,
        timeout: Option<Duration>,
        lock_delay: Duration,
    ) -> Result<u64, Error> {
        self.acquire_call(session, lock, wait, timeout, lock_delay, None)
            .await
    }

    /// Takes the read/write lock `lock` in `mode` for a session (many
    /// shared holders or one exclusive, FIFO across both;
    /// docs/rw-locks.md) and returns the hold's fencing token; waits and
    /// times out as [`acquire_raw`](Self::acquire_raw), and is released
    /// with [`release_raw`](Self::release_raw).
    pub async fn acquire_rw_raw(
        &self,
        session: &SessionHandle,
        lock: &str,
        mode: RwMode,
        wait: bool,
        timeout: Option<Duration>,
    ) -> Result<u64, Error> {
        self.acquire_call(session, lock, wait, timeout, Duration::ZERO, Some(mode))
            .await
    }

    async fn acquire_call(
        &self,
        session: &SessionHandle,
        lock: &str,
        wait: bool,
        timeout: Option<Duration>,
        lock_delay: Duration,
        mode: Option<RwMode>,
    ) -> Result<u64, Error> {
        let call = || {
            Call::Acquire(AcquireRequest {
                mode: mode
                    .map(|mode| mode.as_str().to_owned())
                    .unwrap_or_default(),
                lock_delay_ms: millis(lock_delay),
                session_id: session.id(),
                session_secret: session.secret().to_owned(),
                lock: lock.to_owned(),
                wait,
                timeout_ms: timeout.map(millis),
                // A fresh, larger id for every send, resends to another node
                // included: if a send is abandoned (the future dropped, the
                // connection lost), the server gives back what it would have
                // answered, unless a later attempt took over. Reusing an id
                // would let a stale node's abandon take back a grant a later
                // send of the same id received.
                attempt: next_attempt(),
            })
        };
        let answer = |answer| match answer {
            Answer::Acquire(response) => Some(response),
            _ => None,
        };
        let response = self.call_streamed(call, answer).await?;
        Ok(response.token)
    }

    /// Takes `count` permits of the semaphore `semaphore` for the session,
    /// creating it with `capacity` permits if nobody holds or waits on it
    /// (docs/semaphores.md); waits and times out as
    /// [`acquire_raw`](Self::acquire_raw). Answers every permit of the
    /// grant, tokens ascending; release it with
    /// [`release_raw`](Self::release_raw), naming the semaphore and the
    /// first permit's token.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_permits_raw(
        &self,
        session: &SessionHandle,
        semaphore: &str,
        capacity: u32,
        count: u32,
        wait: bool,
        timeout: Option<Duration>,
    ) -> Result<Vec<Permit>, Error> {
        let call = || {
            Call::AcquirePermits(AcquirePermitsRequest {
                session_id: session.id(),
                session_secret: session.secret().to_owned(),
                semaphore: semaphore.to_owned(),
                capacity,
                count,
                wait,
                timeout_ms: timeout.map(millis),
                // Fresh for every send, as for a lock.
                attempt: next_attempt(),
            })
        };
        let answer = |answer| match answer {
            Answer::AcquirePermits(response) => Some(response),
            _ => None,
        };
        let response = self.call_streamed(call, answer).await?;
        Ok(response.permits)
    }

    /// Who holds and waits on the semaphore `semaphore`; `None` if nobody.
    pub async fn semaphore_status(&self, semaphore: &str) -> Result<Option<SemaphoreState>, Error> {
        Ok(self.semaphore_status_with_index(semaphore).await?.0)
    }

    /// [`semaphore_status`](Self::semaphore_status), and the log index of
    /// the state it read (as [`lock_status_with_index`](Self::lock_status_with_index)).
    pub async fn semaphore_status_with_index(
        &self,
        semaphore: &str,
    ) -> Result<(Option<SemaphoreState>, u64), Error> {
        let request = SemaphoreStatusRequest {
            semaphore: semaphore.to_owned(),
        };
        let response = self
            .call(Repeat::Freely, request, |channel, request| async move {
                DeadboltClient::new(channel).semaphore_status(request).await
            })
            .await?;
        Ok((response.state, response.index))
    }

    /// Creates the semaphore `semaphore` with `capacity` permits, kept while
    /// nobody holds it, or changes the capacity of the one that exists
    /// (docs/semaphores.md); needs the `admin` permission. Acquirers may
    /// then pass capacity 0 to take what it has. Answers its state.
    pub async fn define_semaphore(
        &self,
        semaphore: &str,
        capacity: u32,
    ) -> Result<Option<SemaphoreState>, Error> {
        let request = DefineSemaphoreRequest {
            semaphore: semaphore.to_owned(),
            capacity,
        };
        let response = self
            .call(Repeat::IfUnsent, request, |channel, request| async move {
                DeadboltClient::new(channel).define_semaphore(request).await
            })
            .await?;
        Ok(response.state)
    }

    /// Drops the definition of `semaphore`: it goes once nobody holds or
    /// waits on it. Needs the `admin` permission.
    pub async fn delete_semaphore(&self, semaphore: &str) -> Result<Option<SemaphoreState>, Error> {
        let request = DeleteSemaphoreRequest {
            semaphore: semaphore.to_owned(),
        };
        let response = self
            .call(Repeat::IfUnsent, request, |channel, request| async move {
                DeadboltClient::new(channel).delete_semaphore(request).await
            })
            .await?;
        Ok(response.state)
    }

    /// Runs for leader of the election `election` with `value`
    /// (docs/elections.md): elected at once if nobody leads and nobody is
    /// queued, else with `wait` queued FIFO among the candidates for at
    /// most `timeout`. Answers the term (the leadership's fencing token);
    /// resign with [`release_raw`](Self::release_raw).
    pub async fn campaign_raw(
        &self,
        session: &SessionHandle,
        election: &str,
        value: &str,
        wait: bool,
        timeout: Option<Duration>,
    ) -> Result<u64, Error> {
        let call = || {
            Call::Campaign(CampaignRequest {
                session_id: session.id(),
                session_secret: session.secret().to_owned(),
                election: election.to_owned(),
                value: value.to_owned(),
                wait,
                timeout_ms: timeout.map(millis),
                // Fresh for every send, as for a lock.
                attempt: next_attempt(),
            })
        };
        let answer = |answer| match answer {
            Answer::Campaign(response) => Some(response),
            _ => None,
        };
        let response = self.call_streamed(call, answer).await?;
        Ok(response.term)
    }

    /// The leader of `election` (elected in `term`) makes `value` its value.
    pub async fn proclaim_raw(
        &self,
        session: &SessionHandle,
        election: &str,
        term: u64,
        value: &str,
    ) -> Result<(), Error> {
        let request = ProclaimRequest {
            session_id: session.id(),
            session_secret: session.secret().to_owned(),
            election: election.to_owned(),
            term,
            value: value.to_owned(),
        };
        // Repeated, the same value is proclaimed again under the same term.
        self.call(Repeat::Idempotent, request, |channel, request| async move {
            DeadboltClient::new(channel).proclaim(request).await
        })
        .await?;
        Ok(())
    }

    /// The leader of `election` and its candidates, next in line first;
    /// no leader if nobody campaigns.
    pub async fn leader(&self, election: &str) -> Result<LeaderResponse, Error> {
        let request = LeaderRequest {
            election: election.to_owned(),
        };
        self.call(Repeat::Freely, request, |channel, request| async move {
            DeadboltClient::new(channel).leader(request).await
        })
        .await
    }

    /// Releases `lock`, held by the session with fencing token `token`.
    pub async fn release_raw(
        &self,
        session: &SessionHandle,
        lock: &str,
        token: u64,
    ) -> Result<(), Error> {
        let call = || {
            Call::Release(ReleaseRequest {
                session_id: session.id(),
                session_secret: session.secret().to_owned(),
                lock: lock.to_owned(),
                token,
            })
        };
        let answer = |answer| match answer {
            Answer::Release(_) => Some(()),
            _ => None,
        };
        self.call_streamed(call, answer).await
    }

    /// Whether `token` is the current grant of `lock` (a linearizable check,
    /// for resources that cannot keep a fence); also the current grant's
    /// token, if the lock is held.
    pub async fn check_token(&self, lock: &str, token: u64) -> Result<(bool, Option<u64>), Error> {
        let request = CheckTokenRequest {
            lock: lock.to_owned(),
            token,
        };
        let response = self
            .call(Repeat::Freely, request, |channel, request| async move {
                DeadboltClient::new(channel).check_token(request).await
            })
            .await?;
        Ok((response.current, response.current_token))
    }

    /// Who held `lock` and how each grant ended, oldest first, in the
    /// service's own order (only the newest records are kept).
    pub async fn lock_history(&self, lock: &str) -> Result<Vec<AuditEntry>, Error> {
        let request = LockHistoryRequest {
            lock: lock.to_owned(),
        };
        let response = self
            .call(Repeat::Freely, request, |channel, request| async move {
                DeadboltClient::new(channel).lock_history(request).await
            })
            .await?;
        Ok(response.entries)
    }

    /// Sets `key` in the fenced store, if no token above `token` has changed
    /// or fenced-read it (else [`ErrorKind::StaleToken`], naming both). With
    /// `lock`, `token` must also be that lock's current grant. Returns the
    /// key's new fence.
    pub async fn store_put(
        &self,
        key: &str,
        value: &str,
        token: u64,
        lock: Option<&str>,
    ) -> Result<u64, Error> {
        let request = StorePutRequest {
            key: key.to_owned(),
            value: value.to_owned(),
            token,
            lock: lock.map(str::to_owned),
        };
        // Repeated, it writes the same value under the same token, which
        // the key's fence still takes (it refuses only lower tokens): the
        // same outcome, or `stale_token` if a newer holder wrote meanwhile,
        // which is then the truth.
        let response = self
            .call(Repeat::Idempotent, request, |channel, request| async move {
                DeadboltClient::new(channel).store_put(request).await
            })
            .await?;
        Ok(response.fence)
    }

    /// Reads `key`. With a token, the read is fenced: it raises the key's
    /// fence to `token`, so that a holder with an older token can no longer
    /// write what it read before (the safe read-modify-write).
    pub async fn store_get(
        &self,
        key: &str,
        fenced: Option<(u64, Option<&str>)>,
    ) -> Result<Stored, Error> {
        let request = StoreGetRequest {
            key: key.to_owned(),
            token: fenced.map(|(token, _)| token),
            lock: fenced.and_then(|(_, lock)| lock.map(str::to_owned)),
        };
        let response = self
            .call(Repeat::Freely, request, |channel, request| async move {
                DeadboltClient::new(channel).store_get(request).await
            })
            .await?;
        Ok(Stored {
            value: response.found.then_some(response.value),
            fence: response.fence,
        })
    }

    /// Deletes `key`, fenced like [`store_put`](Self::store_put). Returns
    /// whether it had a value: repeated after a lost answer (as every
    /// failover repeats it), `false` though the first attempt deleted one.
    pub async fn store_delete(
        &self,
        key: &str,
        token: u64,
        lock: Option<&str>,
    ) -> Result<bool, Error> {
        let request = StoreDeleteRequest {
            key: key.to_owned(),
            token,
            lock: lock.map(str::to_owned),
        };
        let response = self
            .call(Repeat::Idempotent, request, |channel, request| async move {
                DeadboltClient::new(channel).store_delete(request).await
            })
            .await?;
        Ok(response.existed)
    }

    /// The answering node's role, log indexes, and view of the membership.
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse, Error> {
        self.call(
            Repeat::Freely,
            ClusterStatusRequest {},
            |channel, request| async move { ClusterClient::new(channel).status(request).await },
        )
        .await
    }

    /// Adds node `node_id`, serving at `address` (`host:port`), to the
    /// cluster: as a learner until it has caught up, then as a voter.
    /// Returns the leader's view of the cluster afterwards. Idempotent: an
    /// add cut short by an election is sent on to the new leader, which
    /// finishes it; a node already listed at another address is refused.
    pub async fn add_member(
        &self,
        node_id: u64,
        address: &str,
    ) -> Result<ClusterStatusResponse, Error> {
        let request = AddMemberRequest {
            node_id,
            address: address.to_owned(),
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            ClusterClient::new(channel).add_member(request).await
        })
        .await
    }

    /// Removes node `node_id` from the cluster.
    pub async fn remove_member(&self, node_id: u64) -> Result<ClusterStatusResponse, Error> {
        let request = RemoveMemberRequest { node_id };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            ClusterClient::new(channel).remove_member(request).await
        })
        .await
    }

    /// The table's limits in force (as the answering node has applied
    /// them), their floors and ceilings, and what the table holds.
    pub async fn limits(&self) -> Result<LimitsResponse, Error> {
        self.call(
            Repeat::Freely,
            LimitsRequest {},
            |channel, request| async move { ClusterClient::new(channel).limits(request).await },
        )
        .await
    }

    /// Changes the limits `request` sets (the `admin` permission); the
    /// others keep their values. Returns the limits now in force.
    pub async fn set_limits(&self, request: SetLimitsRequest) -> Result<LimitsResponse, Error> {
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            ClusterClient::new(channel).set_limits(request).await
        })
        .await
    }

    /// Turns access control on (once) and returns the first token, for
    /// identity `root`. Shown once: keep it.
    pub async fn acl_bootstrap(&self) -> Result<AclTokenResponse, Error> {
        self.call(
            Repeat::IfUnsent,
            AclBootstrapRequest {},
            |channel, request| async move { AccessClient::new(channel).bootstrap(request).await },
        )
        .await
    }

    /// Who this client is to the server, and what it may do.
    pub async fn acl_whoami(&self) -> Result<WhoAmIResponse, Error> {
        self.call(
            Repeat::Freely,
            WhoAmIRequest {},
            |channel, request| async move { AccessClient::new(channel).who_am_i(request).await },
        )
        .await
    }

    /// Roles, identities and token ids (needs the admin permission).
    pub async fn acl_show(&self) -> Result<AclShowResponse, Error> {
        self.call(
            Repeat::Freely,
            AclShowRequest {},
            |channel, request| async move { AccessClient::new(channel).show(request).await },
        )
        .await
    }

    /// A new token for `identity`, working until revoked. Shown once: the
    /// server keeps a hash.
    pub async fn acl_create_token(&self, identity: &str) -> Result<AclTokenResponse, Error> {
        self.create_token(identity, Duration::ZERO).await
    }

    /// A new token for `identity` that stops working `ttl` after the server
    /// makes it (`expires_unix_ms` in the answer says when). Needs cluster
    /// version 4.
    pub async fn acl_create_expiring_token(
        &self,
        identity: &str,
        ttl: Duration,
    ) -> Result<AclTokenResponse, Error> {
        if ttl.is_zero() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "a token's time to live must be above zero (make one without, to last until revoked)",
            ));
        }
        self.create_token(identity, ttl).await
    }

    async fn create_token(&self, identity: &str, ttl: Duration) -> Result<AclTokenResponse, Error> {
        let request = AclCreateTokenRequest {
            identity: identity.to_owned(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            AccessClient::new(channel).create_token(request).await
        })
        .await
    }

    /// Refuses `identity` (`deny`: its tokens and any client certificate
    /// with its name) from its next call on, or takes it off the deny list.
    /// Needs cluster version 4.
    pub async fn acl_deny_identity(&self, identity: &str, deny: bool) -> Result<(), Error> {
        let request = AclIdentityName {
            identity: identity.to_owned(),
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            let mut access = AccessClient::new(channel);
            if deny {
                access.deny_identity(request).await
            } else {
                access.allow_identity(request).await
            }
        })
        .await?;
        Ok(())
    }

    pub async fn acl_revoke_token(&self, token_id: &str) -> Result<(), Error> {
        let request = AclRevokeTokenRequest {
            token_id: token_id.to_owned(),
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            AccessClient::new(channel).revoke_token(request).await
        })
        .await?;
        Ok(())
    }

    /// Creates role `name`, or replaces its grants.
    pub async fn acl_put_role(&self, name: &str, grants: Vec<AclGrant>) -> Result<(), Error> {
        let request = AclRole {
            name: name.to_owned(),
            grants,
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            AccessClient::new(channel).put_role(request).await
        })
        .await?;
        Ok(())
    }

    pub async fn acl_delete_role(&self, name: &str) -> Result<(), Error> {
        let request = AclDeleteRoleRequest {
            name: name.to_owned(),
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            AccessClient::new(channel).delete_role(request).await
        })
        .await?;
        Ok(())
    }

    /// Gives `identity` the role (`grant`), or takes it away.
    pub async fn acl_bind_role(
        &self,
        identity: &str,
        role: &str,
        grant: bool,
    ) -> Result<(), Error> {
        let request = AclRoleBinding {
            identity: identity.to_owned(),
            role: role.to_owned(),
        };
        self.call(Repeat::IfUnsent, request, |channel, request| async move {
            let mut access = AccessClient::new(channel);
            if grant {
                access.grant_role(request).await
            } else {
                access.revoke_role(request).await
            }
        })
        .await?;
        Ok(())
    }

    /// Makes a call on the current endpoint. A request that certainly had no
    /// effect (refused by a node that is not the leader, or never sent
    /// because the endpoint refused the connection) is sent again, straight
    /// away, to the leader named or to the next endpoint; during an election
    /// (no leader known) after a short pause. Any other failure is returned
    /// to the caller, for whom the outcome is then unknown; later calls go
    /// to the next endpoint.
    ///
    /// With [`Repeat::Freely`] (a read, which changes nothing), also after
    /// the connection broke once the request went out: a status read cut
    /// by the leader's death failed in a CI run instead.
    async fn call<Req, T, Fut>(
        &self,
        repeat: Repeat,
        request: Req,
        send: impl Fn(Link, Req) -> Fut,
    ) -> Result<T, Error>
    where
        Req: Clone,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let send = &send;
        let (answer, hint) = self
            .call_over(
                (repeat, Patience::Budget),
                Current::channel,
                request,
                |channel, request| async move {
                    send(channel, request).await.map(|response| {
                        let hint = response
                            .metadata()
                            .get(deadbolt_proto::LEADER_KEY)
                            .and_then(|leader| leader.to_str().ok())
                            .map(str::to_owned);
                        (response.into_inner(), hint)
                    })
                },
            )
            .await?;
        if let Some(leader) = hint {
            self.follow_hint(&leader);
        }
        Ok(answer)
    }

    /// A node that forwarded a call to the leader (`deadbolt server` does
    /// from release 0.2.0) named it: later calls go there themselves, a hop
    /// shorter. Once a leader reached this way cannot be connected to, the
    /// client follows no more such hints: it may sit behind a load balancer,
    /// with the leaders' addresses out of its reach, and the forwarding
    /// nodes serve it anyway.
    fn follow_hint(&self, leader: &str) {
        if !self.shared.follow_hints.load(Ordering::Relaxed) {
            return;
        }
        let generation = {
            let current = self.current();
            if authority(&current.address) == authority(&normalize_endpoint(leader)) {
                return;
            }
            current.generation
        };
        self.switch(generation, Some(leader), true);
    }

    /// Makes one call over the `Calls` stream (see [`Calls`]), with the
    /// retries of [`call`](Self::call). `call` builds the request afresh for
    /// every send; `answer` picks the expected answer out.
    async fn call_streamed<T>(
        &self,
        call: impl Fn() -> Call,
        answer: impl Fn(Answer) -> Option<T>,
    ) -> Result<T, Error> {
        let (call, answer) = (&call, &answer);
        self.call_over(
            (Repeat::IfUnsent, Patience::Search),
            |current| current.calls(&self.shared.framing),
            (),
            |calls, ()| async move {
                match calls.call(call()).await? {
                    Answer::Error(error) => Err(error.into_status()),
                    other => answer(other).ok_or_else(|| {
                        tonic::Status::internal("the server answered a different call")
                    }),
                }
            },
        )
        .await
    }

    /// Sends `request` over what `link` takes from the current endpoint (its
    /// channel, or its `Calls` stream), retrying elsewhere as
    /// [`call`](Self::call) describes.
    pub(crate) async fn call_over<Link, Req, T, Fut>(
        &self,
        (repeat, patience): (Repeat, Patience),
        link: impl Fn(&mut Current) -> Link,
        request: Req,
        send: impl Fn(Link, Req) -> Fut,
    ) -> Result<T, Error>
    where
        Req: Clone,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let started = crate::clock::now();
        let give_up = started + FAILOVER_BUDGET;
        let mut backoff = Backoff::new(BASE, FAILOVER_CAP);
        // An earlier attempt of this change failed in a way that may have
        // let it through: what a later attempt is refused with is then not
        // the whole story.
        let mut maybe_done: Option<Error> = None;
        loop {
            let (address, generation, hinted, link) = {
                let mut current = self.current();
                (
                    current.address.clone(),
                    current.generation,
                    current.hinted,
                    link(&mut current),
                )
            };
            let status = match send(link, request.clone()).await {
                Ok(response) => return Ok(response),
                Err(status) => status,
            };
            let error = Error::from_status(&status, &address);
            if hinted && error.had_no_effect() && error.kind() == ErrorKind::Unavailable {
                tracing::debug!(endpoint = %address, "cannot reach the leader a node named; following no more such hints");
                self.shared.follow_hints.store(false, Ordering::Relaxed);
            }
            if !error.points_elsewhere() {
                return Err(match maybe_done {
                    Some(earlier) => Error::of_unknown_outcome(&earlier, &error),
                    None => error,
                });
            }
            let moved = self.move_on(generation, error.leader());
            let repeatable = error.had_no_effect() || repeat != Repeat::IfUnsent;
            if !repeatable {
                return Err(error);
            }
            if repeat == Repeat::Idempotent && !error.had_no_effect() {
                maybe_done.get_or_insert_with(|| error.clone());
            }
            if patience == Patience::Search {
                // A call that never took effect is worth sending again where
                // the client moved to, or to the leader once one is elected.
                let elsewhere = moved || error.kind() == ErrorKind::NotLeader;
                if !elsewhere
                    || crate::clock::now().saturating_duration_since(started) > LEADER_SEARCH
                {
                    return Err(error);
                }
                if error.leader().is_none() {
                    tokio::time::sleep(ELECTION_PAUSE).await;
                }
                continue;
            }
            // Straight to a leader that was named; otherwise (an election
            // under way, a node down, a forwarding node that lost its
            // leader) after a jittered pause, or every client of a dead
            // leader would hammer the survivors at once. The pause starts
            // short: a new leader is usually there within a second.
            if !moved || error.leader().is_none() {
                let delay = crate::simulation::with_rng(|mut rng| backoff.next_delay(&mut rng));
                if crate::clock::now() + delay >= give_up {
                    return Err(error);
                }
                tokio::time::sleep(delay).await;
            } else if crate::clock::now() >= give_up {
                return Err(error);
            }
        }
    }

    /// Points later calls at the leader the failed call named: one of our
    /// endpoints, or an address outside them, dialled the same way as the
    /// endpoint that named it. With no leader named, at the next endpoint
    /// given after the search's position, skipping the one that just
    /// failed. Nothing changes if another call already moved on from the one
    /// that failed, or if there is nowhere else to go. Says whether calls
    /// now go elsewhere than the failed one did.
    pub(crate) fn move_on(&self, failed_generation: u64, leader: Option<&str>) -> bool {
        self.switch(failed_generation, leader, false)
    }

    /// Gives up on the endpoint of `generation`, which took a call and
    /// never answered it (a paused node, or a leader cut off from the
    /// others): later calls go elsewhere, as after a failure, and the calls
    /// still waiting on its `Calls` stream fail now, to be repeated there
    /// by whoever made them.
    pub(crate) fn abandon(&self, generation: u64, why: &str) {
        let (address, calls) = {
            let current = self.current();
            if current.generation != generation {
                return;
            }
            (current.address.clone(), current.calls.clone())
        };
        self.move_on(generation, None);
        if let Some(calls) = calls {
            calls.abandon(tonic::Status::unavailable(format!(
                "gave up on {address}: {why}"
            )));
        }
    }

    /// [`move_on`](Self::move_on), saying whether the switch follows a
    /// forwarding node's hint (`hinted`) rather than a failure.
    fn switch(&self, failed_generation: u64, leader: Option<&str>, hinted: bool) -> bool {
        let targets = &self.shared.targets;
        let mut current = self.current();
        if current.generation != failed_generation {
            return true;
        }
        // A leader hint is `host:port`; our endpoints may say `https://`.
        let leader = leader.map(|leader| authority(&normalize_endpoint(leader)).to_owned());
        let given = leader.as_deref().and_then(|leader| {
            targets
                .iter()
                .position(|target| authority(&target.address) == leader)
        });
        let named = match (given, &leader) {
            (None, Some(leader)) => self.named_leader(&current.address, leader),
            _ => None,
        };
        // A hint takes calls elsewhere but leaves the search where it was:
        // going back to the endpoint that named a leader, once that leader
        // knows none, would ping-pong between the two while the leader is
        // elected among the others. A learner still names the leader it last
        // heard from, and a CI run's `cluster add` spent its whole search so.
        let (index, target) = match (given, &named) {
            (Some(given), _) => (current.index, &targets[given]),
            (None, Some(named)) => (current.index, named),
            (None, None) => {
                let next = (1..=targets.len())
                    .map(|step| (current.index + step) % targets.len())
                    .find(|index| targets[*index].address != *current.address);
                // With a single endpoint there is nowhere else to go; its
                // channel reconnects by itself on the next call.
                let Some(index) = next else { return false };
                (index, &targets[index])
            }
        };
        // Lazy: dialling happens on the next call, which reports failure the
        // same way as any other call.
        let channel =
            (self.shared.authorization).link(target.connect_lazy(self.shared.dial.as_ref()));
        *current = Current::new(index, &target.address, current.generation + 1, channel);
        current.hinted = hinted;
        tracing::debug!(endpoint = %target.address, hinted, "switched endpoint");
        true
    }

    /// The leader a node named at `leader` (`host:port`), outside the
    /// endpoints given, reached with the scheme of the endpoint that named it
    /// (`via`) and the same TLS settings: a node's certificate must still
    /// verify against the CA given, so a hint cannot lead the client (and its
    /// access token) to a server the CA does not vouch for.
    fn named_leader(&self, via: &str, leader: &str) -> Option<Target> {
        let scheme = via.split_once("://").map_or("http", |(scheme, _)| scheme);
        Target::parse(format!("{scheme}://{leader}"), &self.shared.tls)
            .inspect_err(|error| tracing::debug!(%error, "cannot dial the leader named"))
            .ok()
    }

    /// Where calls go now: the endpoint's address, the generation (for
    /// [`move_on`](Self::move_on)) and its channel.
    pub(crate) fn endpoint_now(&self) -> (Arc<str>, u64, Link) {
        let mut current = self.current();
        (
            current.address.clone(),
            current.generation,
            current.channel(),
        )
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        // The fields are only ever overwritten whole, so a panic elsewhere
        // while holding the lock cannot leave them inconsistent.
        self.shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// `host:port` of an endpoint URL.
fn authority(address: &str) -> &str {
    address.split_once("://").map_or(address, |(_, rest)| rest)
}

impl Target {
    async fn connect(&self, dial: Option<&Dial>) -> Result<Channel, tonic::transport::Error> {
        match dial {
            None => self.endpoint.connect().await,
            Some(dial) => self.endpoint.connect_with_connector(dial.connector()).await,
        }
    }

    fn connect_lazy(&self, dial: Option<&Dial>) -> Channel {
        match dial {
            None => self.endpoint.connect_lazy(),
            Some(dial) => self.endpoint.connect_with_connector_lazy(dial.connector()),
        }
    }

    fn parse(raw: String, tls: &TlsOptions) -> Result<Target, Error> {
        let mut address = normalize_endpoint(&raw);
        let invalid = |why: String| Error::new(ErrorKind::InvalidArgument, why);
        if tls.config.is_some() && !raw.contains("://") {
            address = address.replacen("http://", "https://", 1);
        }
        let scheme = address
            .split_once("://")
            .map_or("http", |(scheme, _)| scheme);
        let endpoint = Endpoint::from_shared(address.clone()).map_err(|error| {
            invalid(format!(
                "invalid endpoint {raw:?}: {}",
                describe_chain(&error)
            ))
        })?;
        let endpoint = match (scheme, &tls.config) {
            ("http", _) => endpoint,
            ("https", Some(config)) => endpoint.tls_config(config.clone()).map_err(|error| {
                invalid(format!(
                    "invalid endpoint {raw:?}: {}",
                    describe_chain(&error)
                ))
            })?,
            ("https", None) => {
                return Err(invalid(format!(
                    "endpoint {raw:?} is https://: give the CA that signed the server's \
                     certificate (--ca, or DEADBOLT_CA)"
                )))
            }
            (other, _) => {
                return Err(invalid(format!(
                    "invalid endpoint {raw:?}: Deadbolt speaks HTTP/2 over http:// or https://, \
                     not {other}://"
                )))
            }
        };
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PING_INTERVAL)
            .keep_alive_timeout(PING_TIMEOUT);
        Ok(Target { address, endpoint })
    }
}

/// Adds the `http://` scheme to a bare `host:port` (and Deadbolt's port to a
/// bare host) and drops a trailing `/`, so the address reads the same in
/// every error message.
fn normalize_endpoint(raw: &str) -> String {
    let address = raw.trim().trim_end_matches('/');
    if address.contains("://") {
        return address.to_owned();
    }
    let has_port = !address.ends_with(']')
        && address
            .rsplit_once(':')
            .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()));
    if has_port {
        format!("http://{address}")
    } else {
        format!("http://{address}:{DEFAULT_PORT}")
    }
}

/// The port `deadbolt server` listens on unless told otherwise.
const DEFAULT_PORT: u16 = 7070;

/// Whole milliseconds, as the API counts them; absurdly long durations
/// saturate rather than wrap.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Acquire attempt ids: strictly increasing within this process and, being
/// microseconds of wall-clock time, roughly across processes, so that the
/// server can tell a retry from the older request it replaces.
fn next_attempt() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    if let Some(simulated) = crate::simulation::next_attempt() {
        return simulated;
    }
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64);
    let previous = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(last.saturating_add(1).max(now))
        })
        .expect("the update always succeeds");
    previous.saturating_add(1).max(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_host_port_gets_http() {
        assert_eq!(
            normalize_endpoint("127.0.0.1:7070"),
            "http://127.0.0.1:7070"
        );
        assert_eq!(normalize_endpoint(" db1:7070/ "), "http://db1:7070");
        assert_eq!(normalize_endpoint("db1"), "http://db1:7070");
        assert_eq!(normalize_endpoint("[::1]"), "http://[::1]:7070");
        assert_eq!(normalize_endpoint("[::1]:7071"), "http://[::1]:7071");
    }

    #[test]
    fn https_endpoints_without_a_ca_are_refused_rather_than_spoken_to_in_plain_text() {
        let error =
            Target::parse("https://lock.example".to_owned(), &TlsOptions::default()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidArgument);
        assert!(error.message().contains("--ca"), "{error}");
        let error =
            Target::parse("ftp://lock.example".to_owned(), &TlsOptions::default()).unwrap_err();
        assert!(error.message().contains("not ftp://"), "{error}");
    }

    #[test]
    fn urls_keep_their_scheme() {
        assert_eq!(
            normalize_endpoint("http://127.0.0.1:7070"),
            "http://127.0.0.1:7070"
        );
        assert_eq!(
            normalize_endpoint("https://lock.example/"),
            "https://lock.example"
        );
    }

    #[test]
    fn invalid_endpoint_is_an_invalid_argument() {
        let error =
            Target::parse("http://exa mple:1".to_owned(), &TlsOptions::default()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidArgument);
        assert!(error.message().contains("exa mple"), "{error}");
    }

    /// A client on `addresses`, calling the first, without dialling any.
    fn undialled(addresses: &[&str]) -> Client {
        let tls = TlsOptions::default();
        let targets: Vec<Target> = addresses
            .iter()
            .map(|address| Target::parse((*address).to_owned(), &tls).unwrap())
            .collect();
        let authorization = Authorization::default();
        let channel = authorization.link(targets[0].endpoint.connect_lazy());
        let current = Current::new(0, &targets[0].address, 0, channel);
        Client {
            shared: Arc::new(Shared {
                current: Mutex::new(current),
                targets,
                tls,
                authorization,
                follow_hints: AtomicBool::new(true),
                dial: None,
                framing: Framing::new(None, None, None),
            }),
        }
    }

    /// Fails the call in flight with `leader` as its hint; returns where
    /// calls go next.
    fn fail(client: &Client, leader: Option<&str>) -> String {
        let generation = client.current().generation;
        client.move_on(generation, leader);
        client.current().address.to_string()
    }

    /// CI, `cluster add` after an election: node 2, a learner, kept naming
    /// node 1, which had stopped leading and knew no leader. The search went
    /// 2, 1, 2, 1, ... for its whole two seconds and never asked node 3,
    /// which was being elected.
    #[tokio::test]
    async fn a_learner_naming_a_deposed_leader_does_not_keep_the_search_from_the_others() {
        let (n1, n2, n3) = ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003");
        let client = undialled(&[n1, n2, n3]);
        let mut asked = vec![fail(&client, None)];
        for _ in 0..4 {
            let hint = (asked.last().unwrap() == &format!("http://{n2}")).then_some(n1);
            asked.push(fail(&client, hint));
        }
        let asked: Vec<&str> = asked.iter().map(|a| authority(a)).collect();
        assert_eq!(asked, [n2, n1, n3, n1, n2]);
    }

    #[tokio::test]
    async fn a_leader_named_outside_the_endpoints_is_tried_then_the_endpoint_again() {
        let client = undialled(&["127.0.0.1:7001"]);
        assert_eq!(fail(&client, Some("10.0.0.9:7001")), "http://10.0.0.9:7001");
        assert_eq!(fail(&client, None), "http://127.0.0.1:7001");
        // Nowhere else to go: the one endpoint's channel reconnects itself.
        let generation = client.current().generation;
        assert!(!client.move_on(generation, None));
    }

    /// A port nothing listens on: connections to it are refused.
    fn refused_address() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    }

    /// Behind a load balancer, the leader a forwarding node names may be
    /// out of the client's reach: the client tries it, goes back to its
    /// endpoint, and follows no more hints.
    #[tokio::test]
    async fn a_hinted_leader_out_of_reach_is_tried_once_then_hints_are_ignored() {
        let balancer = refused_address();
        let client = undialled(&[&balancer]);
        let leader = refused_address();
        client.follow_hint(&leader);
        assert_eq!(*client.current().address, format!("http://{leader}"));
        let health = client
            .call(Repeat::IfUnsent, HealthRequest {}, |channel, request| async move {
                DeadboltClient::new(channel).health(request).await
            })
            .await;
        assert_eq!(health.unwrap_err().kind(), ErrorKind::Unavailable);
        assert_eq!(*client.current().address, format!("http://{balancer}"));
        client.follow_hint(&leader);
        assert_eq!(*client.current().address, format!("http://{balancer}"));
    }

    #[test]
    fn durations_become_whole_milliseconds() {
        assert_eq!(millis(Duration::from_micros(2_500)), 2);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
