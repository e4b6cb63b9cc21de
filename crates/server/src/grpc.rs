//! The gRPC front end: `deadbolt.v1.Deadbolt` and `deadbolt.v1.Cluster`
//! calls go to [`Api`], and [`ApiError`]s come back as statuses carrying a
//! `deadbolt-error` kind (and `deadbolt-leader` when the leader is known).
//! The `Calls` stream is served by [`CallStream`], and the peers' `RaftPeer`
//! service is mounted here too, on the same port.

use crate::api::Api;
use crate::auth::peers::PeerGate;
use crate::auth::Credentials;
use crate::calls::{is_undecodable, CallStream};
use crate::network::PeerService;
use crate::node::ApiError;
use crate::raft_types::Raft;
use crate::tls::TlsClient;
use deadbolt_proto::v1::access_server::{Access, AccessServer};
use deadbolt_proto::v1::cluster_server::{Cluster, ClusterServer};
use deadbolt_proto::v1::deadbolt_server::{Deadbolt, DeadboltServer};
use deadbolt_proto::v1::raft_peer_server::RaftPeerServer;
use deadbolt_proto::v1::*;
use deadbolt_proto::MAX_MESSAGE_BYTES;
use futures::StreamExt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

/// Every gRPC service of a node, as one axum router. The peer service sits
/// behind `gate`, which refuses a caller before its message is read.
/// `stopping` turns true when the server begins to shut down.
pub fn router(
    api: Api,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    raft: Raft,
    ready_to_join: Option<Arc<AtomicBool>>,
    gate: PeerGate,
    stopping: watch::Receiver<bool>,
) -> axum::Router {
    let peers = tonic::service::interceptor::InterceptedService::new(
        RaftPeerServer::new(PeerService::new(raft, ready_to_join))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        gate,
    );
    client_routes(api, stopping)
        .add_service(peers)
        .add_service(health)
        .add_service(reflection())
        .add_service(reflection_v1alpha())
        .into_axum_router()
        .layer(axum::middleware::map_response(
            undecodable_requests_are_invalid_arguments,
        ))
}

/// The services clients call: `Deadbolt`, `Cluster` and `Access`. The
/// simulation serves these alone, over its own network.
pub fn client_routes(api: Api, stopping: watch::Receiver<bool>) -> tonic::service::Routes {
    tonic::service::Routes::new(DeadboltServer::new(GrpcApi::new(
        api.clone(),
        stopping.clone(),
    )))
    .add_service(ClusterServer::new(GrpcApi::new(
        api.clone(),
        stopping.clone(),
    )))
    .add_service(AccessServer::new(GrpcApi::new(api, stopping)))
}

/// gRPC server reflection (v1, which grpcurl and Postman ask first), from
/// the proto's own descriptors: the API can be listed and called without a
/// copy of `deadbolt.proto`. Open to everyone, as the proto is public.
fn reflection() -> tonic_reflection::server::v1::ServerReflectionServer<
    impl tonic_reflection::server::v1::ServerReflection,
> {
    described()
        .build_v1()
        .expect("the proto's own descriptors build a reflection service")
}

/// The same, as `grpc.reflection.v1alpha`: what older tools ask, and only
/// that (older grpcurl builds, Python's `grpcio-reflection` descriptor
/// database, Evans); without it they found no service at all.
fn reflection_v1alpha() -> tonic_reflection::server::v1alpha::ServerReflectionServer<
    impl tonic_reflection::server::v1alpha::ServerReflection,
> {
    described()
        .build_v1alpha()
        .expect("the proto's own descriptors build a reflection service")
}

/// What reflection describes: the client API and the health service.
fn described() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(deadbolt_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// tonic answers a request message it cannot decode with INTERNAL, which
/// reads as the server's fault; it is the caller's. Such a refusal comes as
/// a trailers-only response (its status in the headers), which is rewritten
/// to INVALID_ARGUMENT with the `deadbolt-error` kind every other refusal
/// carries. (A bad message later in the `Calls` stream is answered by id;
/// see `calls.rs`.)
async fn undecodable_requests_are_invalid_arguments(
    mut response: axum::response::Response,
) -> axum::response::Response {
    use axum::http::HeaderValue;
    let headers = response.headers_mut();
    let internal = headers
        .get("grpc-status")
        .is_some_and(|status| status == "13");
    let message = headers
        .get("grpc-message")
        .and_then(|message| message.to_str().ok())
        .unwrap_or_default();
    if is_undecodable(internal, message) {
        let invalid = (Status::invalid_argument("").code() as i32).to_string();
        headers.insert(
            "grpc-status",
            HeaderValue::from_str(&invalid).expect("a number"),
        );
        headers.insert(
            deadbolt_proto::ERROR_KIND_KEY,
            HeaderValue::from_static(deadbolt_proto::ErrorKind::InvalidArgument.as_str()),
        );
    }
    response
}

pub struct GrpcApi {
    api: Api,
    stopping: watch::Receiver<bool>,
}

impl GrpcApi {
    pub fn new(api: Api, stopping: watch::Receiver<bool>) -> Self {
        GrpcApi { api, stopping }
    }
}

/// What a gRPC call presented: its `authorization` metadata and the TLS
/// client certificate.
fn credentials<T>(request: &Request<T>) -> Credentials {
    Credentials::new(
        request
            .metadata()
            .get("authorization")
            .map(|value| value.as_bytes()),
        request.extensions().get::<TlsClient>(),
    )
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Self {
        CallError::from(err).into_status()
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
            self.api
                .open_session(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn keep_alive(&self, request: Request<KeepAliveRequest>) -> Reply<KeepAliveResponse> {
        Ok(Response::new(
            self.api
                .keep_alive(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Reply<CloseSessionResponse> {
        Ok(Response::new(
            self.api
                .close_session(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn acquire(&self, request: Request<AcquireRequest>) -> Reply<AcquireResponse> {
        Ok(Response::new(
            self.api
                .acquire(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn release(&self, request: Request<ReleaseRequest>) -> Reply<ReleaseResponse> {
        Ok(Response::new(
            self.api
                .release(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    type CallsStream = CallStream;

    type WatchStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<WatchResponse, Status>> + Send>>;

    // A stream's items are tonic's own `Result<_, Status>`.
    #[allow(clippy::result_large_err)]
    async fn watch(&self, request: Request<WatchRequest>) -> Reply<Self::WatchStream> {
        let watch = self
            .api
            .watch(&credentials(&request), request.into_inner())
            .await?;
        let answers = watch
            .into_stream()
            .map(|answer| answer.map_err(Status::from));
        Ok(Response::new(Box::pin(answers)))
    }

    async fn calls(&self, request: Request<Streaming<CallRequest>>) -> Reply<CallStream> {
        Ok(Response::new(CallStream::new(
            self.api.clone(),
            credentials(&request),
            request.into_inner(),
            self.stopping.clone(),
        )))
    }

    async fn acquire_permits(
        &self,
        request: Request<AcquirePermitsRequest>,
    ) -> Reply<AcquirePermitsResponse> {
        Ok(Response::new(
            self.api
                .acquire_permits(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn campaign(&self, request: Request<CampaignRequest>) -> Reply<CampaignResponse> {
        Ok(Response::new(
            self.api
                .campaign(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn define_semaphore(
        &self,
        request: Request<DefineSemaphoreRequest>,
    ) -> Reply<SemaphoreStatusResponse> {
        Ok(Response::new(
            self.api
                .define_semaphore(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn delete_semaphore(
        &self,
        request: Request<DeleteSemaphoreRequest>,
    ) -> Reply<SemaphoreStatusResponse> {
        Ok(Response::new(
            self.api
                .delete_semaphore(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn proclaim(&self, request: Request<ProclaimRequest>) -> Reply<ProclaimResponse> {
        Ok(Response::new(
            self.api
                .proclaim(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn leader(&self, request: Request<LeaderRequest>) -> Reply<LeaderResponse> {
        Ok(Response::new(
            self.api
                .leader(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn semaphore_status(
        &self,
        request: Request<SemaphoreStatusRequest>,
    ) -> Reply<SemaphoreStatusResponse> {
        Ok(Response::new(
            self.api
                .semaphore_status(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn lock_status(&self, request: Request<LockStatusRequest>) -> Reply<LockStatusResponse> {
        Ok(Response::new(
            self.api
                .lock_status(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn list_locks(&self, request: Request<ListLocksRequest>) -> Reply<ListLocksResponse> {
        Ok(Response::new(
            self.api
                .list_locks(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn health(&self, _request: Request<HealthRequest>) -> Reply<HealthResponse> {
        Ok(Response::new(self.api.health()))
    }

    async fn check_token(&self, request: Request<CheckTokenRequest>) -> Reply<CheckTokenResponse> {
        Ok(Response::new(
            self.api
                .check_token(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn lock_history(
        &self,
        request: Request<LockHistoryRequest>,
    ) -> Reply<LockHistoryResponse> {
        Ok(Response::new(
            self.api
                .lock_history(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn store_put(&self, request: Request<StorePutRequest>) -> Reply<StorePutResponse> {
        Ok(Response::new(
            self.api
                .store_put(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn store_get(&self, request: Request<StoreGetRequest>) -> Reply<StoreGetResponse> {
        Ok(Response::new(
            self.api
                .store_get(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn store_delete(
        &self,
        request: Request<StoreDeleteRequest>,
    ) -> Reply<StoreDeleteResponse> {
        Ok(Response::new(
            self.api
                .store_delete(&credentials(&request), request.into_inner())
                .await?,
        ))
    }
}

#[tonic::async_trait]
impl Cluster for GrpcApi {
    async fn status(
        &self,
        _request: Request<ClusterStatusRequest>,
    ) -> Reply<ClusterStatusResponse> {
        Ok(Response::new(self.api.cluster_status().await))
    }

    async fn add_member(&self, request: Request<AddMemberRequest>) -> Reply<ClusterStatusResponse> {
        Ok(Response::new(
            self.api
                .add_member(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Reply<ClusterStatusResponse> {
        Ok(Response::new(
            self.api
                .remove_member(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn limits(&self, _request: Request<LimitsRequest>) -> Reply<LimitsResponse> {
        Ok(Response::new(self.api.limits()))
    }

    async fn set_limits(&self, request: Request<SetLimitsRequest>) -> Reply<LimitsResponse> {
        Ok(Response::new(
            self.api
                .set_limits(&credentials(&request), request.into_inner())
                .await?,
        ))
    }
}

#[tonic::async_trait]
impl Access for GrpcApi {
    async fn bootstrap(&self, request: Request<AclBootstrapRequest>) -> Reply<AclTokenResponse> {
        Ok(Response::new(
            self.api.acl_bootstrap(&credentials(&request)).await?,
        ))
    }

    async fn who_am_i(&self, request: Request<WhoAmIRequest>) -> Reply<WhoAmIResponse> {
        Ok(Response::new(
            self.api.acl_whoami(&credentials(&request)).await?,
        ))
    }

    async fn show(&self, request: Request<AclShowRequest>) -> Reply<AclShowResponse> {
        Ok(Response::new(
            self.api.acl_show(&credentials(&request)).await?,
        ))
    }

    async fn create_token(
        &self,
        request: Request<AclCreateTokenRequest>,
    ) -> Reply<AclTokenResponse> {
        Ok(Response::new(
            self.api
                .acl_create_token(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn revoke_token(
        &self,
        request: Request<AclRevokeTokenRequest>,
    ) -> Reply<AclChangedResponse> {
        Ok(Response::new(
            self.api
                .acl_revoke_token(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn put_role(&self, request: Request<AclRole>) -> Reply<AclChangedResponse> {
        Ok(Response::new(
            self.api
                .acl_put_role(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn delete_role(
        &self,
        request: Request<AclDeleteRoleRequest>,
    ) -> Reply<AclChangedResponse> {
        Ok(Response::new(
            self.api
                .acl_delete_role(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn grant_role(&self, request: Request<AclRoleBinding>) -> Reply<AclChangedResponse> {
        Ok(Response::new(
            self.api
                .acl_grant_role(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn revoke_role(&self, request: Request<AclRoleBinding>) -> Reply<AclChangedResponse> {
        Ok(Response::new(
            self.api
                .acl_revoke_role(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn deny_identity(&self, request: Request<AclIdentityName>) -> Reply<AclChangedResponse> {
        Ok(Response::new(
            self.api
                .acl_deny_identity(&credentials(&request), request.into_inner())
                .await?,
        ))
    }

    async fn allow_identity(&self, request: Request<AclIdentityName>) -> Reply<AclChangedResponse> {
        Ok(Response::new(
            self.api
                .acl_allow_identity(&credentials(&request), request.into_inner())
                .await?,
        ))
    }
}

/// Untrusted bytes in, an error or a message out, never a panic: random
/// bytes as every request message of the client API, the `Calls` stream's
/// included. (tonic decodes with prost before any of our code runs; this
/// checks the messages as we declared them. `cargo test -p deadbolt-server
/// untrusted`.)
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn every_message(bytes: &[u8]) {
        let _ = OpenSessionRequest::decode(bytes);
        let _ = KeepAliveRequest::decode(bytes);
        let _ = CloseSessionRequest::decode(bytes);
        let _ = AcquireRequest::decode(bytes);
        let _ = ReleaseRequest::decode(bytes);
        let _ = CallRequest::decode(bytes);
        let _ = LockStatusRequest::decode(bytes);
        let _ = ListLocksRequest::decode(bytes);
        let _ = CheckTokenRequest::decode(bytes);
        let _ = LockHistoryRequest::decode(bytes);
        let _ = StorePutRequest::decode(bytes);
        let _ = StoreGetRequest::decode(bytes);
        let _ = StoreDeleteRequest::decode(bytes);
        let _ = AddMemberRequest::decode(bytes);
        let _ = RemoveMemberRequest::decode(bytes);
        let _ = AclCreateTokenRequest::decode(bytes);
        let _ = AclRevokeTokenRequest::decode(bytes);
        let _ = AclRole::decode(bytes);
        let _ = AclDeleteRoleRequest::decode(bytes);
        let _ = AclRoleBinding::decode(bytes);
        let _ = AclIdentityName::decode(bytes);
    }

    proptest! {
        #[test]
        fn untrusted_grpc_messages_of_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            every_message(&bytes);
        }

        #[test]
        fn untrusted_calls_stream_messages_with_a_valid_frame_never_panic(
            id in any::<u64>(),
            inner in prop::collection::vec(any::<u8>(), 0..128),
        ) {
            // A CallRequest whose id parses and whose call is garbage.
            let mut bytes = Vec::new();
            prost::encoding::uint64::encode(1, &id, &mut bytes);
            prost::encoding::bytes::encode(2, &inner, &mut bytes);
            every_message(&bytes);
        }
    }
}
