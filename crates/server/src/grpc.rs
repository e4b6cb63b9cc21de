//! The gRPC front end: translates `deadbolt.v1.Deadbolt` calls to [`Node`]
//! operations and [`ApiError`]s to statuses carrying a `deadbolt-error` kind.

use crate::node::{ApiError, Node};
use deadbolt_core::{LockInfo, SessionId, Token};
use deadbolt_proto::v1::deadbolt_server::Deadbolt;
use deadbolt_proto::v1::*;
use std::time::Duration;
use tonic::{Request, Response, Status};

pub struct GrpcApi {
    node: Node,
}

impl GrpcApi {
    pub fn new(node: Node) -> Self {
        GrpcApi { node }
    }
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Self {
        err.kind.status(err.message)
    }
}

pub(crate) fn lock_state(info: LockInfo) -> LockState {
    LockState {
        lock: info.name,
        holder_session_id: info.holder.0,
        token: info.token.0,
        waiter_session_ids: info.waiters.into_iter().map(|s| s.0).collect(),
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Deadbolt for GrpcApi {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Reply<OpenSessionResponse> {
        let ttl = Duration::from_millis(request.into_inner().ttl_ms);
        let (session, ttl) = self.node.open_session(ttl).await?;
        Ok(Response::new(OpenSessionResponse {
            session_id: session.0,
            ttl_ms: ttl.as_millis() as u64,
        }))
    }

    async fn keep_alive(&self, request: Request<KeepAliveRequest>) -> Reply<KeepAliveResponse> {
        let ttl = self
            .node
            .keep_alive(SessionId(request.into_inner().session_id))?;
        Ok(Response::new(KeepAliveResponse {
            ttl_ms: ttl.as_millis() as u64,
        }))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Reply<CloseSessionResponse> {
        self.node
            .close_session(SessionId(request.into_inner().session_id))
            .await?;
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn acquire(&self, request: Request<AcquireRequest>) -> Reply<AcquireResponse> {
        let request = request.into_inner();
        let token = self
            .node
            .acquire(
                SessionId(request.session_id),
                &request.lock,
                request.wait,
                request.timeout_ms.map(Duration::from_millis),
            )
            .await?;
        Ok(Response::new(AcquireResponse { token: token.0 }))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Reply<ReleaseResponse> {
        let request = request.into_inner();
        self.node
            .release(
                SessionId(request.session_id),
                &request.lock,
                Token(request.token),
            )
            .await?;
        Ok(Response::new(ReleaseResponse {}))
    }

    async fn lock_status(&self, request: Request<LockStatusRequest>) -> Reply<LockStatusResponse> {
        let info = self.node.lock_status(&request.into_inner().lock).await?;
        Ok(Response::new(LockStatusResponse {
            state: info.map(lock_state),
        }))
    }

    async fn list_locks(&self, request: Request<ListLocksRequest>) -> Reply<ListLocksResponse> {
        let request = request.into_inner();
        let (locks, more) = self
            .node
            .list_locks(&request.after, request.limit as usize)
            .await?;
        Ok(Response::new(ListLocksResponse {
            locks: locks.into_iter().map(lock_state).collect(),
            more,
        }))
    }

    async fn health(&self, _request: Request<HealthRequest>) -> Reply<HealthResponse> {
        Ok(Response::new(self.node.health().into()))
    }
}

impl From<crate::node::Health> for HealthResponse {
    fn from(health: crate::node::Health) -> Self {
        HealthResponse {
            node_id: health.node_id,
            leader: health.leader,
            term: health.term,
            last_applied_index: health.last_applied_index,
            sessions: health.sessions as u64,
            locks: health.locks as u64,
            next_token: health.next_token.0,
            snapshot_index: health.snapshot_index,
            purged_index: health.purged_index,
        }
    }
}
