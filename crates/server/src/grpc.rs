//! The gRPC front end: `deadbolt.v1.Deadbolt` calls go to [`Api`], and
//! [`ApiError`]s come back as statuses carrying a `deadbolt-error` kind.

use crate::api::Api;
use crate::node::ApiError;
use deadbolt_proto::v1::deadbolt_server::Deadbolt;
use deadbolt_proto::v1::*;
use tonic::{Request, Response, Status};

pub struct GrpcApi {
    api: Api,
}

impl GrpcApi {
    pub fn new(api: Api) -> Self {
        GrpcApi { api }
    }
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Self {
        err.kind.status(err.message)
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Deadbolt for GrpcApi {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Reply<OpenSessionResponse> {
        Ok(Response::new(
            self.api.open_session(request.into_inner()).await?,
        ))
    }

    async fn keep_alive(&self, request: Request<KeepAliveRequest>) -> Reply<KeepAliveResponse> {
        Ok(Response::new(self.api.keep_alive(request.into_inner())?))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Reply<CloseSessionResponse> {
        Ok(Response::new(
            self.api.close_session(request.into_inner()).await?,
        ))
    }

    async fn acquire(&self, request: Request<AcquireRequest>) -> Reply<AcquireResponse> {
        Ok(Response::new(self.api.acquire(request.into_inner()).await?))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Reply<ReleaseResponse> {
        Ok(Response::new(self.api.release(request.into_inner()).await?))
    }

    async fn lock_status(&self, request: Request<LockStatusRequest>) -> Reply<LockStatusResponse> {
        Ok(Response::new(
            self.api.lock_status(request.into_inner()).await?,
        ))
    }

    async fn list_locks(&self, request: Request<ListLocksRequest>) -> Reply<ListLocksResponse> {
        Ok(Response::new(
            self.api.list_locks(request.into_inner()).await?,
        ))
    }

    async fn health(&self, _request: Request<HealthRequest>) -> Reply<HealthResponse> {
        Ok(Response::new(self.api.health()))
    }
}
