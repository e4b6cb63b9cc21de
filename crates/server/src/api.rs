//! [`Api`]: every call of the Deadbolt API, on the protobuf messages, once.
//!
//! The gRPC and HTTP front ends only move these messages on and off their
//! wire, so the two APIs cannot drift apart. Every call on a session passes
//! [`Node::authorize`] with the session's secret first (see `secret.rs`).

use crate::metrics::Call;
use crate::node::{ApiError, Health, Node, OwnedSession};
use crate::secret::SecretSource;
use deadbolt_core::{AuditKind, Command, LockInfo, Outcome, SessionId, StoredValue, Token};
use deadbolt_proto::v1::*;
use std::future::Future;
use std::time::Duration;

#[derive(Clone)]
pub struct Api {
    node: Node,
    /// Where new sessions' secrets come from.
    secrets: SecretSource,
}

type Reply<T> = Result<T, ApiError>;

impl Api {
    pub fn new(node: Node, secrets: SecretSource) -> Self {
        Api { node, secrets }
    }

    /// Runs one call, timing it and counting its error, if any (see
    /// `metrics.rs`): every API answers through here.
    async fn timed<T>(&self, call: Call, work: impl Future<Output = Reply<T>>) -> Reply<T> {
        let metrics = &self.node.metrics;
        let _timer = metrics.call_started(call);
        let reply = work.await;
        if let Err(err) = &reply {
            metrics.call_failed(err.kind);
        }
        reply
    }

    /// The Prometheus scrape, in the text format of `metrics::CONTENT_TYPE`.
    pub fn metrics(&self) -> String {
        self.node.metrics_text()
    }

    /// The session a call acts on, if the call carries its secret.
    async fn owned(&self, session_id: u64, secret: &str) -> Reply<OwnedSession> {
        self.node.authorize(SessionId(session_id), secret).await
    }

    pub async fn open_session(&self, request: OpenSessionRequest) -> Reply<OpenSessionResponse> {
        self.timed(Call::OpenSession, async {
            let ttl = Duration::from_millis(request.ttl_ms);
            let (secret, hash) = self.secrets.draw();
            let (session, ttl) = self.node.open_session(ttl, hash).await?;
            Ok(OpenSessionResponse {
                session_id: session.0,
                ttl_ms: millis(ttl),
                session_secret: secret,
            })
        })
        .await
    }

    pub async fn keep_alive(&self, request: KeepAliveRequest) -> Reply<KeepAliveResponse> {
        self.timed(Call::KeepAlive, async {
            let session = self
                .owned(request.session_id, &request.session_secret)
                .await?;
            let ttl = self.node.keep_alive(session).await?;
            Ok(KeepAliveResponse {
                ttl_ms: millis(ttl),
            })
        })
        .await
    }

    pub async fn close_session(&self, request: CloseSessionRequest) -> Reply<CloseSessionResponse> {
        self.timed(Call::CloseSession, async {
            let session = self
                .owned(request.session_id, &request.session_secret)
                .await?;
            self.node.close_session(session).await?;
            Ok(CloseSessionResponse {})
        })
        .await
    }

    pub async fn acquire(&self, request: AcquireRequest) -> Reply<AcquireResponse> {
        self.timed(Call::Acquire, async {
            let session = self
                .owned(request.session_id, &request.session_secret)
                .await?;
            let token = self
                .node
                .acquire(
                    session,
                    &request.lock,
                    request.wait,
                    request.timeout_ms.map(Duration::from_millis),
                    request.attempt,
                    Duration::from_millis(request.lock_delay_ms),
                )
                .await?;
            Ok(AcquireResponse { token: token.0 })
        })
        .await
    }

    pub async fn release(&self, request: ReleaseRequest) -> Reply<ReleaseResponse> {
        self.timed(Call::Release, async {
            let session = self
                .owned(request.session_id, &request.session_secret)
                .await?;
            self.node
                .release(session, &request.lock, Token(request.token))
                .await?;
            Ok(ReleaseResponse {})
        })
        .await
    }

    pub async fn lock_status(&self, request: LockStatusRequest) -> Reply<LockStatusResponse> {
        self.timed(Call::LockStatus, async {
            let info = self.node.lock_status(&request.lock).await?;
            Ok(LockStatusResponse {
                state: info.map(lock_state),
            })
        })
        .await
    }

    pub async fn list_locks(&self, request: ListLocksRequest) -> Reply<ListLocksResponse> {
        self.timed(Call::ListLocks, async {
            let (locks, more) = self
                .node
                .list_locks(&request.after, request.limit as usize)
                .await?;
            Ok(ListLocksResponse {
                locks: locks.into_iter().map(lock_state).collect(),
                more,
            })
        })
        .await
    }

    /// A backup file of the applied table (`backup.rs`), from the leader.
    /// Needs the `admin` permission: it holds every session's secret hash
    /// and every store value.
    pub async fn snapshot(&self) -> Reply<Vec<u8>> {
        crate::backup::take(&self.node).await
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
    pub async fn check_token(&self, request: CheckTokenRequest) -> Reply<CheckTokenResponse> {
        self.timed(Call::CheckToken, async {
            let (current, token) = self
                .node
                .check_token(&request.lock, Token(request.token))
                .await?;
            Ok(CheckTokenResponse {
                current,
                current_token: token.map(|t| t.0),
            })
        })
        .await
    }

    pub async fn lock_history(&self, request: LockHistoryRequest) -> Reply<LockHistoryResponse> {
        self.timed(Call::LockHistory, async {
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
                })
                .collect();
            Ok(LockHistoryResponse { entries })
        })
        .await
    }

    pub async fn store_put(&self, request: StorePutRequest) -> Reply<StorePutResponse> {
        self.timed(Call::StorePut, async {
            let command = Command::StorePut {
                key: request.key,
                value: request.value,
                token: Token(request.token),
                lock: request.lock,
            };
            match self.node.store_change(command).await? {
                Outcome::Stored { fence } => Ok(StorePutResponse { fence: fence.0 }),
                other => unreachable!("store put answered {other:?}"),
            }
        })
        .await
    }

    pub async fn store_get(&self, request: StoreGetRequest) -> Reply<StoreGetResponse> {
        self.timed(Call::StoreGet, async {
            let read = match request.token {
                None => self.node.store_get(&request.key).await?,
                Some(token) => {
                    let command = Command::StoreRead {
                        key: request.key,
                        token: Token(token),
                        lock: request.lock,
                    };
                    match self.node.store_change(command).await? {
                        Outcome::Read(read) => Some(read),
                        other => unreachable!("store read answered {other:?}"),
                    }
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
        .await
    }

    pub async fn store_delete(&self, request: StoreDeleteRequest) -> Reply<StoreDeleteResponse> {
        self.timed(Call::StoreDelete, async {
            let command = Command::StoreDelete {
                key: request.key,
                token: Token(request.token),
                lock: request.lock,
            };
            match self.node.store_change(command).await? {
                Outcome::Deleted { existed } => Ok(StoreDeleteResponse { existed }),
                other => unreachable!("store delete answered {other:?}"),
            }
        })
        .await
    }
}

impl Api {
    pub async fn cluster_status(&self) -> ClusterStatusResponse {
        self.node.cluster_status().await
    }

    pub async fn add_member(&self, request: AddMemberRequest) -> Reply<ClusterStatusResponse> {
        self.timed(Call::AddMember, async {
            self.node
                .add_member(request.node_id, &request.address)
                .await?;
            Ok(self.node.cluster_status().await)
        })
        .await
    }

    pub async fn remove_member(
        &self,
        request: RemoveMemberRequest,
    ) -> Reply<ClusterStatusResponse> {
        self.timed(Call::RemoveMember, async {
            self.node.remove_member(request.node_id).await?;
            Ok(self.node.cluster_status().await)
        })
        .await
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
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn lock_state(info: LockInfo) -> LockState {
    LockState {
        lock: info.name,
        holder_session_id: info.holder.0,
        token: info.token.0,
        waiter_session_ids: info.waiters.into_iter().map(|s| s.0).collect(),
        lock_delay: info.delayed,
    }
}
