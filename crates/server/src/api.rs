//! [`Api`]: every call of the Deadbolt API, on the protobuf messages, once.
//!
//! The gRPC and HTTP front ends only move these messages on and off their
//! wire, so the two APIs cannot drift apart. Every call authenticates its
//! [`Credentials`] and asks [`Node::permit`] first (see `auth/`), and every
//! call on a session passes [`Node::authorize`] with the session's secret
//! (see `secret.rs`).
//!
//! Its length (about 1,090 lines) is one function per call of the API, each a
//! few lines: the calls are written once here for both front ends, and a file
//! per call would spread one pattern over forty files.

use crate::auth::{self, Caller, Credentials, InFlight};
use crate::metrics::{Call, Welcome};
use crate::node::{ApiError, Health, Indexed, Node, OwnedSession};
use crate::secret::SecretSource;
use crate::watches::{self, Cursor, Positioned, WatchEnd, Watcher};
use deadbolt_core::{
    AclCommand, AuditKind, Grant, LockInfo, Permission, Proposal, RwMode, SessionId, StoredValue,
    Token,
};
use deadbolt_proto::v1::*;
use deadbolt_proto::ErrorKind;
use futures::FutureExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
pub struct Api {
    node: Node,
    /// Where new sessions' secrets come from.
    secrets: SecretSource,
    /// Each identity's calls in flight.
    in_flight: Arc<InFlight>,
}

type Reply<T> = Result<T, ApiError>;

impl Api {
    pub fn new(node: Node, secrets: SecretSource, in_flight: Arc<InFlight>) -> Self {
        Api {
            node,
            secrets,
            in_flight,
        }
    }

    /// Runs one call, timing it and counting its error, if any (see
    /// `metrics.rs`): every API answers through here.
    ///
    /// A combinator, not an `async fn`: an `async fn` keeps the future it
    /// is handed twice over (as its argument, and again while awaiting it),
    /// which made every call's future twice the size of its work (1,944
    /// bytes for a release; `calls.rs` allocates and copies one per call).
    /// For the same reason the calls below are plain functions that return
    /// `timed` around an `async move` block: an `async fn` keeps its
    /// arguments twice (as given, and as the locals its body moves them
    /// into), so each request was held twice, and its future once more
    /// around the block's.
    fn timed<'a, T: 'a>(
        &'a self,
        call: Call,
        work: impl Future<Output = Reply<T>> + 'a,
    ) -> impl Future<Output = Reply<T>> + 'a {
        let metrics = &self.node.metrics;
        let timer = metrics.call_started(call);
        work.map(move |reply| {
            if let Err(err) = &reply {
                metrics.call_failed(err.kind);
            }
            drop(timer);
            reply
        })
    }

    /// Whether this node serves framed calls (`frames.rs`) now, counting
    /// the answer: not while another node leads, as a follower forwards
    /// only the gRPC `Calls` stream to its leader (`forward.rs`), so the
    /// client should use that.
    pub fn welcome_framed_calls(&self) -> Reply<()> {
        let metrics = &self.node.metrics;
        if self.node.leader_elsewhere() {
            metrics.framed_connection(Welcome::Refused);
            let why = "a follower serves framed calls to no one; use the Calls stream";
            return Err(self.node.not_leader(why));
        }
        metrics.framed_connection(Welcome::Served);
        Ok(())
    }

    /// Who is calling, if they may use `permission` on `resource` (`None`:
    /// on anything; see [`Node::permit`]).
    async fn caller(
        &self,
        credentials: &Credentials,
        permission: Permission,
        resource: Option<&str>,
    ) -> Reply<Caller> {
        let caller = self.node.authenticate(credentials).await?;
        self.node.permit(&caller, permission, resource)?;
        caller.admit(&self.in_flight)
    }

    /// The Prometheus scrape, in the text format of `metrics::CONTENT_TYPE`.
    /// With access control on, it takes a `read` permission.
    pub async fn metrics(&self, credentials: &Credentials) -> Reply<String> {
        let _caller = self.caller(credentials, Permission::Read, None).await?;
        Ok(self.node.metrics_text())
    }

    /// The session a call acts on, if the caller opened it and the call
    /// carries its secret.
    async fn owned(&self, caller: &Caller, session_id: u64, secret: &str) -> Reply<OwnedSession> {
        self.node
            .authorize(caller.identity(), SessionId(session_id), secret)
            .await
    }

    pub fn open_session<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: OpenSessionRequest,
    ) -> impl Future<Output = Reply<OpenSessionResponse>> + 'a {
        self.timed(Call::OpenSession, async move {
            let caller = self.caller(credentials, Permission::Lock, None).await?;
            let ttl = Duration::from_millis(request.ttl_ms);
            let (secret, hash) = self.secrets.draw();
            let (session, ttl) = self.node.open_session(ttl, hash, caller.identity).await?;
            Ok(OpenSessionResponse {
                session_id: session.0,
                ttl_ms: millis(ttl),
                session_secret: secret,
            })
        })
    }

    pub fn keep_alive<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: KeepAliveRequest,
    ) -> impl Future<Output = Reply<KeepAliveResponse>> + 'a {
        self.timed(Call::KeepAlive, async move {
            let caller = self.caller(credentials, Permission::Lock, None).await?;
            let session = self
                .owned(&caller, request.session_id, &request.session_secret)
                .await?;
            let ttl = self.node.keep_alive(session).await?;
            Ok(KeepAliveResponse {
                ttl_ms: millis(ttl),
            })
        })
    }

    pub fn close_session<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: CloseSessionRequest,
    ) -> impl Future<Output = Reply<CloseSessionResponse>> + 'a {
        self.timed(Call::CloseSession, async move {
            let caller = self.caller(credentials, Permission::Lock, None).await?;
            let session = self
                .owned(&caller, request.session_id, &request.session_secret)
                .await?;
            self.node.close_session(session).await?;
            Ok(CloseSessionResponse {})
        })
    }

    pub fn acquire<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: AcquireRequest,
    ) -> impl Future<Output = Reply<AcquireResponse>> + 'a {
        self.timed(Call::Acquire, async move {
            let lock = Some(request.lock.as_str());
            let caller = self.caller(credentials, Permission::Lock, lock).await?;
            let mode = rw_mode(&request.mode)?;
            let session = self
                .owned(&caller, request.session_id, &request.session_secret)
                .await?;
            let timeout = request.timeout_ms.map(Duration::from_millis);
            let (wait, attempt) = (request.wait, request.attempt);
            let token = match mode {
                None => {
                    let lock_delay = Duration::from_millis(request.lock_delay_ms);
                    let lock = &request.lock;
                    let node = &self.node;
                    node.acquire(session, lock, wait, timeout, attempt, lock_delay)
                        .await?
                }
                Some(_) if request.lock_delay_ms > 0 => {
                    return Err(ApiError::new(
                        ErrorKind::InvalidArgument,
                        "lock_delay_ms is for locks: a read/write lock has none (fence its \
                         resource instead)",
                    ));
                }
                Some(mode) => {
                    let lock = &request.lock;
                    let node = &self.node;
                    node.acquire_rw(session, lock, mode, wait, timeout, attempt)
                        .await?
                }
            };
            Ok(AcquireResponse { token: token.0 })
        })
    }

    pub fn release<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: ReleaseRequest,
    ) -> impl Future<Output = Reply<ReleaseResponse>> + 'a {
        self.timed(Call::Release, async move {
            let lock = Some(request.lock.as_str());
            let caller = self.caller(credentials, Permission::Lock, lock).await?;
            let session = self
                .owned(&caller, request.session_id, &request.session_secret)
                .await?;
            self.node
                .release(session, request.lock, Token(request.token))
                .await?;
            Ok(ReleaseResponse {})
        })
    }

    pub fn acquire_permits<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: AcquirePermitsRequest,
    ) -> impl Future<Output = Reply<AcquirePermitsResponse>> + 'a {
        self.timed(Call::Acquire, async move {
            let semaphore = Some(request.semaphore.as_str());
            let caller = self
                .caller(credentials, Permission::Lock, semaphore)
                .await?;
            let session = self
                .owned(&caller, request.session_id, &request.session_secret)
                .await?;
            let permits = self
                .node
                .acquire_permits(
                    session,
                    &request.semaphore,
                    request.capacity,
                    request.count,
                    request.wait,
                    request.timeout_ms.map(Duration::from_millis),
                    request.attempt,
                )
                .await?;
            Ok(AcquirePermitsResponse {
                token: permits.first().map_or(0, |permit| permit.token.0),
                permits: permits.iter().map(permit).collect(),
            })
        })
    }

    pub fn campaign<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: CampaignRequest,
    ) -> impl Future<Output = Reply<CampaignResponse>> + 'a {
        self.timed(Call::Acquire, async move {
            let election = Some(request.election.as_str());
            let caller = self.caller(credentials, Permission::Lock, election).await?;
            let session = self
                .owned(&caller, request.session_id, &request.session_secret)
                .await?;
            let timeout = request.timeout_ms.map(Duration::from_millis);
            let (election, value) = (&request.election, request.value);
            let (wait, attempt) = (request.wait, request.attempt);
            let term = self
                .node
                .campaign(session, election, value, wait, timeout, attempt)
                .await?;
            Ok(CampaignResponse { term: term.0 })
        })
    }

    pub fn proclaim<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: ProclaimRequest,
    ) -> impl Future<Output = Reply<ProclaimResponse>> + 'a {
        self.timed(Call::Proclaim, async move {
            let election = Some(request.election.as_str());
            let caller = self.caller(credentials, Permission::Lock, election).await?;
            let session = self
                .owned(&caller, request.session_id, &request.session_secret)
                .await?;
            let term = Token(request.term);
            self.node
                .proclaim(session, &request.election, term, request.value)
                .await?;
            Ok(ProclaimResponse {})
        })
    }

    pub fn leader<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: LeaderRequest,
    ) -> impl Future<Output = Reply<LeaderResponse>> + 'a {
        self.timed(Call::LockStatus, async move {
            let election = Some(request.election.as_str());
            let _caller = self.caller(credentials, Permission::Read, election).await?;
            let read = self.node.election(&request.election).await?;
            Ok(match read.value {
                None => LeaderResponse {
                    index: read.index,
                    ..Default::default()
                },
                Some(info) => LeaderResponse {
                    leader: Some(ElectionLeader {
                        session_id: info.leader.0 .0,
                        term: info.leader.1 .0,
                        value: info.leader.2,
                    }),
                    candidate_session_ids: info.candidates.iter().map(|s| s.0).collect(),
                    index: read.index,
                },
            })
        })
    }

    /// Starts a watch (see `watches.rs`) of `request.name`, or of every
    /// name under it with `request.prefix`: `Watch::next` gives its events.
    pub async fn watch(&self, credentials: &Credentials, request: WatchRequest) -> Reply<Watch> {
        self.timed(Call::Watch, async {
            let caller = self.node.authenticate(credentials).await?;
            self.node
                .permit_watch(&caller, &request.name, request.prefix)?;
            let caller = caller.admit(&self.in_flight)?;
            let from = match request.after.as_str() {
                "" => None,
                after => Some(Cursor::parse(after).ok_or_else(|| {
                    let message = format!(
                        "after {after:?} is not an event id: give a log index (\"1042\") or an \
                         event's id (\"1042.3\")"
                    );
                    ApiError::new(ErrorKind::InvalidArgument, message)
                })?),
            };
            let WatchRequest { name, prefix, .. } = request;
            let matches: Box<dyn Fn(&str) -> bool + Send + Sync> = match prefix {
                true => Box::new(move |candidate| candidate.starts_with(&name)),
                false => Box::new(move |candidate| candidate == name),
            };
            let watcher = self.node.history.watch(from, matches).ok_or_else(|| {
                let message = format!(
                    "this node serves {} watches already; watch from another node, or share \
                     a prefix watch",
                    watches::MAX_WATCHES
                );
                ApiError::new(ErrorKind::LimitReached, message)
            })?;
            Ok(Watch {
                watcher,
                caller,
                node: self.node.clone(),
                answered: None,
            })
        })
        .await
    }

    pub fn semaphore_status<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: SemaphoreStatusRequest,
    ) -> impl Future<Output = Reply<SemaphoreStatusResponse>> + 'a {
        self.timed(Call::LockStatus, async move {
            let semaphore = Some(request.semaphore.as_str());
            let _caller = self
                .caller(credentials, Permission::Read, semaphore)
                .await?;
            let info = self.node.semaphore_status(&request.semaphore).await?;
            Ok(semaphore_state(info))
        })
    }

    /// Creates or resizes a semaphore; an admin's call.
    pub fn define_semaphore<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: DefineSemaphoreRequest,
    ) -> impl Future<Output = Reply<SemaphoreStatusResponse>> + 'a {
        self.timed(Call::DefineSemaphore, async move {
            let caller = self.caller(credentials, Permission::Admin, None).await?;
            let DefineSemaphoreRequest {
                semaphore,
                capacity,
            } = request;
            let info = self
                .node
                .define_semaphore(&semaphore, Some(capacity))
                .await?;
            tracing::info!(
                by = caller.identity(),
                semaphore,
                capacity,
                "semaphore defined"
            );
            Ok(semaphore_state(info))
        })
    }

    /// Drops a semaphore's definition; an admin's call.
    pub fn delete_semaphore<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: DeleteSemaphoreRequest,
    ) -> impl Future<Output = Reply<SemaphoreStatusResponse>> + 'a {
        self.timed(Call::DefineSemaphore, async move {
            let caller = self.caller(credentials, Permission::Admin, None).await?;
            let info = self.node.define_semaphore(&request.semaphore, None).await?;
            let semaphore = request.semaphore;
            tracing::info!(
                by = caller.identity(),
                semaphore,
                "semaphore definition deleted"
            );
            Ok(semaphore_state(info))
        })
    }

    pub fn lock_status<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: LockStatusRequest,
    ) -> impl Future<Output = Reply<LockStatusResponse>> + 'a {
        self.timed(Call::LockStatus, async move {
            let lock = Some(request.lock.as_str());
            let _caller = self.caller(credentials, Permission::Read, lock).await?;
            let read = self.node.lock_status(&request.lock).await?;
            Ok(LockStatusResponse {
                state: read.value.map(lock_state),
                index: read.index,
            })
        })
    }

    /// A page of locks, without those the caller may not read.
    pub fn list_locks<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: ListLocksRequest,
    ) -> impl Future<Output = Reply<ListLocksResponse>> + 'a {
        self.timed(Call::ListLocks, async move {
            let caller = self.caller(credentials, Permission::Read, None).await?;
            let read = self
                .node
                .list_locks(&request.after, request.limit as usize)
                .await?;
            let (mut locks, more) = read.value;
            self.node.retain_readable(&caller, &mut locks);
            Ok(ListLocksResponse {
                locks: locks.into_iter().map(lock_state).collect(),
                more,
                index: read.index,
            })
        })
    }

    /// A backup file of the applied table (`backup.rs`), from the leader.
    /// Needs the `admin` permission: it holds every session's secret hash
    /// and every store value.
    pub async fn snapshot(&self, credentials: &Credentials) -> Reply<Vec<u8>> {
        let _caller = self.caller(credentials, Permission::Admin, None).await?;
        crate::backup::take(&self.node).await
    }

    /// Ready for clients (`readiness.rs`): open to every caller, as
    /// `health` is.
    pub fn readiness(&self) -> Result<(), String> {
        self.node.readiness()
    }

    pub fn health(&self) -> HealthResponse {
        let Health {
            node_id,
            leader,
            term,
            last_applied_index,
            sessions,
            locks,
            next_token,
            snapshot_index,
            purged_index,
        } = self.node.health();
        HealthResponse {
            node_id,
            leader,
            term,
            last_applied_index,
            sessions: sessions as u64,
            locks: locks as u64,
            next_token: next_token.0,
            snapshot_index,
            purged_index,
        }
    }
}

impl Api {
    pub fn check_token<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: CheckTokenRequest,
    ) -> impl Future<Output = Reply<CheckTokenResponse>> + 'a {
        self.timed(Call::CheckToken, async move {
            let lock = Some(request.lock.as_str());
            let _caller = self.caller(credentials, Permission::Read, lock).await?;
            let (current, token) = self
                .node
                .check_token(&request.lock, Token(request.token))
                .await?;
            Ok(CheckTokenResponse {
                current,
                current_token: token.map(|t| t.0),
            })
        })
    }

    pub fn lock_history<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: LockHistoryRequest,
    ) -> impl Future<Output = Reply<LockHistoryResponse>> + 'a {
        self.timed(Call::LockHistory, async move {
            let lock = Some(request.lock.as_str());
            let _caller = self.caller(credentials, Permission::Read, lock).await?;
            let entries = self
                .node
                .lock_history(&request.lock)
                .await?
                .into_iter()
                .map(|record| AuditEntry {
                    seq: record.seq,
                    at_ms: record.at_ms,
                    session_id: record.session.0,
                    token: record.token.0,
                    what: audit_kind(record.what).to_owned(),
                    identity: record.identity.unwrap_or_default(),
                })
                .collect();
            Ok(LockHistoryResponse { entries })
        })
    }

    pub fn store_put<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: StorePutRequest,
    ) -> impl Future<Output = Reply<StorePutResponse>> + 'a {
        self.timed(Call::StorePut, async move {
            let key = Some(request.key.as_str());
            let _caller = self
                .caller(credentials, Permission::StoreWrite, key)
                .await?;
            let put = Proposal::store_put(
                request.key,
                request.value,
                Token(request.token),
                request.lock,
            );
            let fence = self.node.store_change(put).await?;
            Ok(StorePutResponse { fence: fence.0 })
        })
    }

    pub fn store_get<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: StoreGetRequest,
    ) -> impl Future<Output = Reply<StoreGetResponse>> + 'a {
        self.timed(Call::StoreGet, async move {
            let key = Some(request.key.as_str());
            let _caller = self.caller(credentials, Permission::StoreRead, key).await?;
            let read = match request.token {
                None => self.node.store_get(&request.key).await?,
                Some(token) => {
                    let read = Proposal::store_read(request.key, Token(token), request.lock);
                    Some(self.node.store_change(read).await?)
                }
            };
            Ok(match read {
                Some(StoredValue { value, fence }) => StoreGetResponse {
                    found: value.is_some(),
                    value: value.unwrap_or_default(),
                    fence: fence.0,
                },
                None => StoreGetResponse::default(),
            })
        })
    }

    pub fn store_delete<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: StoreDeleteRequest,
    ) -> impl Future<Output = Reply<StoreDeleteResponse>> + 'a {
        self.timed(Call::StoreDelete, async move {
            let key = Some(request.key.as_str());
            let _caller = self
                .caller(credentials, Permission::StoreWrite, key)
                .await?;
            let delete = Proposal::store_delete(request.key, Token(request.token), request.lock);
            let existed = self.node.store_change(delete).await?;
            Ok(StoreDeleteResponse { existed })
        })
    }
}

impl Api {
    /// Open to everyone, like `/health`: nodes forming a cluster ask each
    /// other for it before any of them has rules to check (and a node whose
    /// data was lost must hear that its peers formed a cluster, to refuse
    /// to start), and it tells no lock's or session's state.
    pub async fn cluster_status(&self) -> ClusterStatusResponse {
        self.node.cluster_status().await
    }

    pub fn add_member<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: AddMemberRequest,
    ) -> impl Future<Output = Reply<ClusterStatusResponse>> + 'a {
        self.timed(Call::AddMember, async move {
            let _caller = self.caller(credentials, Permission::Admin, None).await?;
            self.node
                .add_member(request.node_id, &request.address)
                .await?;
            Ok(self.node.cluster_status().await)
        })
    }

    pub fn remove_member<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: RemoveMemberRequest,
    ) -> impl Future<Output = Reply<ClusterStatusResponse>> + 'a {
        self.timed(Call::RemoveMember, async move {
            let _caller = self.caller(credentials, Permission::Admin, None).await?;
            self.node.remove_member(request.node_id).await?;
            Ok(self.node.cluster_status().await)
        })
    }

    /// Open to everyone, like [`cluster_status`](Self::cluster_status):
    /// limits and counts tell no lock's or session's state.
    pub fn limits(&self) -> LimitsResponse {
        self.node.limits()
    }

    /// Needs `admin`, like membership changes; logged with who made it.
    pub fn set_limits<'a>(
        &'a self,
        credentials: &'a Credentials,
        request: SetLimitsRequest,
    ) -> impl Future<Output = Reply<LimitsResponse>> + 'a {
        self.timed(Call::SetLimits, async move {
            let caller = self.caller(credentials, Permission::Admin, None).await?;
            let change = crate::limits::change_of(&request);
            let limits = self.node.set_limits(change).await?;
            tracing::info!(by = caller.identity(), %change, ?limits, "limits changed");
            // The limits right after this change, not as a later one left them.
            let mut response = self.node.limits();
            response.limits = Some(crate::limits::to_proto(limits));
            Ok(response)
        })
    }
}

/// Access control (see `auth/` and docs/security.md). Everything but
/// bootstrap (which access control being off already allows everyone) and
/// whoami takes the admin permission.
impl Api {
    /// Needs no permission: it only works while access control is off,
    /// when every caller may do everything anyway.
    pub async fn acl_bootstrap(&self, credentials: &Credentials) -> Reply<AclTokenResponse> {
        let _caller = self.node.authenticate(credentials).await?;
        let (token_id, token, hash) = auth::draw_token(&self.secrets);
        let change = AclCommand::Bootstrap {
            token_id: token_id.clone(),
            hash,
        };
        self.node.change_acl(change).await?;
        tracing::warn!(token_id, "access control is on: bootstrapped identity root");
        Ok(AclTokenResponse {
            token_id,
            identity: deadbolt_core::ROOT_IDENTITY.to_owned(),
            token,
            expires_unix_ms: 0,
        })
    }

    pub async fn acl_whoami(&self, credentials: &Credentials) -> Reply<WhoAmIResponse> {
        let caller = self.node.authenticate(credentials).await?;
        let caller = caller.admit(&self.in_flight)?;
        let acl = self.node.acl().await?;
        Ok(WhoAmIResponse {
            enabled: acl.enabled(),
            grants: acl.grants(caller.identity()).map(acl_grant).collect(),
            identity: caller.identity.unwrap_or_default(),
            authenticated_by: caller.by.map_or("", |by| by.as_str()).to_owned(),
        })
    }

    pub async fn acl_show(&self, credentials: &Credentials) -> Reply<AclShowResponse> {
        let _caller = self.caller(credentials, Permission::Admin, None).await?;
        let acl = self.node.acl().await?;
        Ok(AclShowResponse {
            enabled: acl.enabled(),
            roles: acl
                .roles()
                .map(|(name, grants)| AclRole {
                    name: name.to_owned(),
                    grants: grants.iter().map(acl_grant).collect(),
                })
                .collect(),
            identities: acl
                .identities()
                .map(|(name, roles)| AclIdentity {
                    name: name.to_owned(),
                    roles: roles.iter().cloned().collect(),
                })
                .collect(),
            tokens: acl
                .tokens()
                .map(|(id, token)| AclTokenInfo {
                    token_id: id.to_owned(),
                    identity: token.identity.clone(),
                    expires_unix_ms: acl.token_expiry(id).unwrap_or_default(),
                })
                .collect(),
            denied: acl.denied_identities().map(str::to_owned).collect(),
        })
    }

    /// With `ttl_ms`, the token stops working that long after this node
    /// made it (on each node's wall clock: see `deadbolt_core::acl`).
    pub async fn acl_create_token(
        &self,
        credentials: &Credentials,
        request: AclCreateTokenRequest,
    ) -> Reply<AclTokenResponse> {
        let (token_id, token, hash) = auth::draw_token(&self.secrets);
        let (change, expires_unix_ms) = match request.ttl_ms {
            0 => {
                let change = AclCommand::CreateToken {
                    token_id: token_id.clone(),
                    identity: request.identity.clone(),
                    hash,
                };
                (change, 0)
            }
            ttl_ms => {
                let expires_unix_ms = self.node.unix_ms().saturating_add(ttl_ms);
                let change = AclCommand::CreateExpiringToken {
                    token_id: token_id.clone(),
                    identity: request.identity.clone(),
                    hash,
                    expires_unix_ms,
                };
                (change, expires_unix_ms)
            }
        };
        self.change_acl(credentials, change).await?;
        Ok(AclTokenResponse {
            token_id,
            identity: request.identity,
            token,
            expires_unix_ms,
        })
    }

    pub async fn acl_revoke_token(
        &self,
        credentials: &Credentials,
        request: AclRevokeTokenRequest,
    ) -> Reply<AclChangedResponse> {
        let change = AclCommand::RevokeToken {
            token_id: request.token_id,
        };
        self.change_acl(credentials, change).await
    }

    pub async fn acl_put_role(
        &self,
        credentials: &Credentials,
        request: AclRole,
    ) -> Reply<AclChangedResponse> {
        let grants = request
            .grants
            .iter()
            .map(|grant| {
                let permission = Permission::parse(&grant.permission).ok_or_else(|| {
                    let text = format!("{}:{}", grant.permission, grant.prefix);
                    let why = Grant::parse(&text).expect_err("not a permission");
                    ApiError::new(ErrorKind::InvalidArgument, why)
                })?;
                Ok(Grant::new(permission, grant.prefix.clone()))
            })
            .collect::<Reply<Vec<Grant>>>()?;
        let change = AclCommand::PutRole {
            name: request.name,
            grants,
        };
        self.change_acl(credentials, change).await
    }

    pub async fn acl_delete_role(
        &self,
        credentials: &Credentials,
        request: AclDeleteRoleRequest,
    ) -> Reply<AclChangedResponse> {
        let change = AclCommand::DeleteRole { name: request.name };
        self.change_acl(credentials, change).await
    }

    pub async fn acl_grant_role(
        &self,
        credentials: &Credentials,
        request: AclRoleBinding,
    ) -> Reply<AclChangedResponse> {
        let change = AclCommand::GrantRole {
            identity: request.identity,
            role: request.role,
        };
        self.change_acl(credentials, change).await
    }

    pub async fn acl_revoke_role(
        &self,
        credentials: &Credentials,
        request: AclRoleBinding,
    ) -> Reply<AclChangedResponse> {
        let change = AclCommand::RevokeRole {
            identity: request.identity,
            role: request.role,
        };
        self.change_acl(credentials, change).await
    }

    /// Refuses `identity` at its next call, whatever it presents.
    pub async fn acl_deny_identity(
        &self,
        credentials: &Credentials,
        request: AclIdentityName,
    ) -> Reply<AclChangedResponse> {
        let change = AclCommand::DenyIdentity {
            identity: request.identity,
        };
        self.change_acl(credentials, change).await
    }

    pub async fn acl_allow_identity(
        &self,
        credentials: &Credentials,
        request: AclIdentityName,
    ) -> Reply<AclChangedResponse> {
        let change = AclCommand::AllowIdentity {
            identity: request.identity,
        };
        self.change_acl(credentials, change).await
    }

    /// An admin's change to the rules, logged with who made it.
    async fn change_acl(
        &self,
        credentials: &Credentials,
        change: AclCommand,
    ) -> Reply<AclChangedResponse> {
        let caller = self.caller(credentials, Permission::Admin, None).await?;
        let what = change.to_string();
        self.node.change_acl(change).await?;
        tracing::info!(
            by = caller.identity(),
            change = what,
            "access control changed"
        );
        Ok(AclChangedResponse {})
    }
}

fn acl_grant(grant: &Grant) -> AclGrant {
    AclGrant {
        permission: grant.permission.as_str().to_owned(),
        prefix: grant.prefix.clone(),
    }
}

fn audit_kind(kind: AuditKind) -> &'static str {
    match kind {
        AuditKind::Granted => "granted",
        AuditKind::Released => "released",
        AuditKind::Closed => "closed",
        AuditKind::Expired => "expired",
        AuditKind::Abandoned => "abandoned",
        AuditKind::Delayed => "delayed",
        AuditKind::PermitsGranted => "permits_granted",
        AuditKind::SharedGranted => "shared_granted",
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An acquire's `mode`: none for a lock, or a read/write lock's.
fn rw_mode(mode: &str) -> Result<Option<RwMode>, ApiError> {
    match mode {
        "" => Ok(None),
        "shared" => Ok(Some(RwMode::Shared)),
        "exclusive" => Ok(Some(RwMode::Exclusive)),
        other => Err(ApiError::new(
            ErrorKind::InvalidArgument,
            format!(
                "mode {other:?} is not one: \"shared\" or \"exclusive\" for a read/write lock, \
                 empty for a lock"
            ),
        )),
    }
}

fn lock_state(info: LockInfo) -> LockState {
    let hold = |session: SessionId, mode: RwMode, token: Token| RwHold {
        session_id: session.0,
        mode: mode.to_string(),
        token: token.0,
    };
    let mut state = LockState {
        lock: info.name,
        holder_session_id: info.holder.0,
        token: info.token.0,
        waiter_session_ids: info.waiters.into_iter().map(|s| s.0).collect(),
        lock_delay: info.delayed,
        ..LockState::default()
    };
    if let Some(rw) = info.rw {
        state.mode = rw
            .holders
            .first()
            .map(|h| h.1.to_string())
            .unwrap_or_default();
        let holders = rw.holders.into_iter();
        state.holders = holders
            .map(|(s, mode, token)| hold(s, mode, token))
            .collect();
        let waiters = rw.waiters.into_iter();
        state.waiters = waiters.map(|(s, mode)| hold(s, mode, Token(0))).collect();
    }
    state
}

fn permit(permit: &deadbolt_core::Permit) -> Permit {
    Permit {
        token: permit.token.0,
        slot: permit.slot,
    }
}

/// A watch in progress, for its caller (see [`Api::watch`]).
pub struct Watch {
    watcher: Watcher,
    /// Holds the call's place among its identity's calls in flight.
    caller: Caller,
    node: Node,
    /// When the last answer with events went out.
    answered: Option<tokio::time::Instant>,
}

/// The most events one [`WatchResponse`] carries.
const MAX_EVENTS_PER_ANSWER: usize = 1000;

/// A watch answers at most once per this long: events that come faster
/// go out together in the next answer. One answer per event, to 1,000
/// watchers of a busy prefix, took the server's two cores from the locks
/// themselves (their throughput fell 23-fold: docs/watches.md); an idle
/// watch still answers its first event at once.
const ANSWER_EVERY: Duration = Duration::from_millis(10);

impl Watch {
    /// The next events the caller may read, waiting until there are some;
    /// or, once the history the watch needs is gone, `compacted` (and the
    /// watch is over). `unavailable` when the node shuts down.
    pub async fn next(&mut self) -> Reply<WatchResponse> {
        if let Some(answered) = self.answered {
            tokio::time::sleep_until(answered + ANSWER_EVERY).await;
        }
        loop {
            match self.watcher.next(MAX_EVENTS_PER_ANSWER).await {
                Ok(mut found) => {
                    // Credentials that ended since the watch began end it.
                    self.node.still_trusted(&self.caller)?;
                    self.node.retain_watchable(&self.caller, &mut found);
                    if !found.is_empty() {
                        self.answered = Some(tokio::time::Instant::now());
                        return Ok(WatchResponse {
                            events: found.into_iter().map(watch_event).collect(),
                            cursor: self.cursor(),
                            compacted: None,
                        });
                    }
                }
                Err(WatchEnd::Compacted(compacted)) => {
                    return Ok(WatchResponse {
                        events: Vec::new(),
                        cursor: self.cursor(),
                        compacted: Some(WatchCompacted {
                            kept_after: compacted.kept_after,
                            current_index: compacted.current,
                        }),
                    })
                }
                Err(WatchEnd::Closing) => {
                    let message = format!(
                        "this node is shutting down: watch on another, after {}",
                        self.cursor()
                    );
                    return Err(ApiError::new(ErrorKind::Unavailable, message));
                }
            }
        }
    }

    /// The watch's answers as a stream: first one without events that says
    /// where the watch starts (so a client that loses the stream at once
    /// still knows where to resume), then events until the node shuts
    /// down, or a last `compacted` answer followed by the `compacted` error.
    pub fn into_stream(self) -> impl futures::Stream<Item = Reply<WatchResponse>> + Send {
        enum Next {
            Starting(Box<Watch>),
            Watching(Box<Watch>),
            Failing(ApiError),
            Done,
        }
        futures::stream::unfold(Next::Starting(Box::new(self)), |next| async move {
            match next {
                Next::Starting(watch) => {
                    let start = WatchResponse {
                        cursor: watch.cursor(),
                        ..Default::default()
                    };
                    Some((Ok(start), Next::Watching(watch)))
                }
                Next::Watching(mut watch) => match watch.next().await {
                    Ok(answer) => {
                        let then = match &answer.compacted {
                            Some(compacted) => Next::Failing(compacted_error(compacted)),
                            None => Next::Watching(watch),
                        };
                        Some((Ok(answer), then))
                    }
                    Err(err) => Some((Err(err), Next::Done)),
                },
                Next::Failing(err) => Some((Err(err), Next::Done)),
                Next::Done => None,
            }
        })
    }

    /// Where the watch stands, to resume after (an event id or an index).
    pub fn cursor(&self) -> String {
        let cursor = self.watcher.cursor();
        match cursor.event {
            Some(event) => format!("{}.{event}", cursor.index),
            None => cursor.index.to_string(),
        }
    }
}

/// The error that ends a watch whose history is gone.
pub fn compacted_error(compacted: &WatchCompacted) -> ApiError {
    let message = format!(
        "the history this watch needs is gone: this node keeps the events after log index {} \
         only (a watch that falls that far behind is cut off too). Read the current state, then \
         watch after index {}",
        compacted.kept_after, compacted.current_index
    );
    ApiError::new(ErrorKind::Compacted, message)
}

fn watch_event(positioned: Positioned) -> WatchEvent {
    let id = positioned.id();
    let Positioned {
        index,
        event,
        watched,
    } = positioned;
    WatchEvent {
        index,
        position: event,
        id,
        kind: watched.kind.as_str().to_owned(),
        name: watched.name.to_string(),
        session_id: watched.session.map_or(0, |session| session.0),
        identity: watched.identity.unwrap_or_default(),
        token: watched.token.map_or(0, |token| token.0),
        mode: watched
            .mode
            .map(|mode| mode.to_string())
            .unwrap_or_default(),
        permits: watched.permits.unwrap_or(0),
        value: watched.value,
    }
}

/// A semaphore's state for the API (none if it does not exist).
fn semaphore_state(read: Indexed<Option<deadbolt_core::SemaphoreInfo>>) -> SemaphoreStatusResponse {
    SemaphoreStatusResponse {
        index: read.index,
        state: read.value.map(|info| SemaphoreState {
            semaphore: info.name,
            capacity: info.capacity,
            holders: info
                .holders
                .into_iter()
                .map(|(session, permits)| SemaphoreHolder {
                    session_id: session.0,
                    permits: permits.iter().map(permit).collect(),
                })
                .collect(),
            waiters: info
                .waiters
                .into_iter()
                .map(|(session, count)| SemaphoreWaiter {
                    session_id: session.0,
                    count,
                })
                .collect(),
            defined: info.defined,
        }),
    }
}
