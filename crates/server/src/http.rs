//! The HTTP/JSON front end (documented in docs/http-api.md). Same operations
//! and field names as gRPC: the bodies are the protobuf messages in JSON.
//! Errors are `{"error": {"kind": ..., "message": ...}}` with a fitting status.
//!
//! Over 800 lines only with its tests; the front end itself is one route
//! table and one handler per call, each a few lines.

use crate::api::{compacted_error, Api};
use crate::auth::Credentials;
use crate::node::ApiError;
use crate::tls::TlsClient;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use deadbolt_proto::v1::*;
use deadbolt_proto::ErrorKind;
use futures::StreamExt;

/// The HTTP API's routes. A request body that stalls for
/// `body_read_timeout` is answered 408 and its connection closed.
pub fn router(api: Api, body_read_timeout: std::time::Duration) -> Router {
    Router::new()
        .route("/v1/session/open", post(open_session))
        .route("/v1/session/keepalive", post(keep_alive))
        .route("/v1/session/close", post(close_session))
        .route("/v1/lock/acquire", post(acquire))
        .route("/v1/lock/release", post(release))
        .route("/v1/lock/status", get(lock_status))
        .route("/v1/semaphore/acquire", post(acquire_permits))
        .route("/v1/semaphore/release", post(release))
        .route("/v1/semaphore/status", get(semaphore_status))
        .route("/v1/semaphore/define", post(define_semaphore))
        .route("/v1/semaphore/delete", post(delete_semaphore))
        .route("/v1/election/campaign", post(campaign))
        .route("/v1/election/proclaim", post(proclaim))
        .route("/v1/election/resign", post(release))
        .route("/v1/election/leader", get(leader))
        .route("/v1/watch", get(watch))
        .route("/v1/locks", get(list_locks))
        .route("/v1/lock/check", get(check_token))
        .route("/v1/lock/history", get(lock_history))
        .route("/v1/store/put", post(store_put))
        .route("/v1/store/get", get(store_get_plain).post(store_get))
        .route("/v1/store/delete", post(store_delete))
        .route("/v1/cluster/status", get(cluster_status))
        .route("/v1/cluster/add", post(add_member))
        .route("/v1/cluster/remove", post(remove_member))
        .route("/v1/cluster/limits", get(limits).post(set_limits))
        .route("/v1/acl", get(acl_show))
        .route("/v1/acl/bootstrap", post(acl_bootstrap))
        .route("/v1/acl/whoami", get(acl_whoami))
        .route("/v1/acl/token/create", post(acl_create_token))
        .route("/v1/acl/token/revoke", post(acl_revoke_token))
        .route("/v1/acl/role/put", post(acl_put_role))
        .route("/v1/acl/role/delete", post(acl_delete_role))
        .route("/v1/acl/grant", post(acl_grant_role))
        .route("/v1/acl/revoke", post(acl_revoke_role))
        .route("/v1/acl/deny", post(acl_deny_identity))
        .route("/v1/acl/allow", post(acl_allow_identity))
        .route("/v1/snapshot", get(serve_snapshot))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            body_read_timeout,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(
            MAX_BODY_BYTES as usize,
        ))
        .layer(axum::middleware::from_fn(refuse_declared_oversize_bodies))
        .with_state(api)
}

/// The largest request body the HTTP API reads (what axum's extractors
/// enforce while reading, and what a declared length is checked against up
/// front): well above its largest legitimate body, a 64 KiB store value in
/// JSON.
const MAX_BODY_BYTES: u64 = 2 << 20;

/// A body that declares a `Content-Length` above [`MAX_BODY_BYTES`] is
/// answered 413 at once, before any of it is read. A black-box run found
/// one that declared 3,000,000 bytes and sent none waiting out the 10 s
/// body timeout for a 408; the read would have failed at the limit anyway.
async fn refuse_declared_oversize_bodies(
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    match declared {
        Some(declared) if declared > MAX_BODY_BYTES => {
            let message = format!(
                "the request body declares {declared} bytes, above the HTTP API's limit of \
                 {MAX_BODY_BYTES}"
            );
            HttpError(
                StatusCode::PAYLOAD_TOO_LARGE,
                ApiError::new(ErrorKind::InvalidArgument, message),
            )
            .into_response()
        }
        _ => next.run(request).await,
    }
}

/// What no route takes. gRPC requests get gRPC's `unimplemented`, as tonic
/// would answer them; anything else a JSON error like every other call's,
/// rather than an empty 200 (the gRPC fallback's) that a typo'd path would
/// otherwise get.
pub async fn unknown_path(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let grpc = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"));
    if grpc {
        let message = format!("no such gRPC method: {}", uri.path());
        return tonic::Status::unimplemented(message)
            .into_http()
            .into_response();
    }
    let message = format!(
        "no such endpoint: {method} {}; the HTTP API is described in docs/http-api.md",
        uri.path()
    );
    HttpError(
        StatusCode::NOT_FOUND,
        ApiError::new(ErrorKind::InvalidArgument, message),
    )
    .into_response()
}

/// A known path with the wrong method (`GET /v1/lock/acquire`).
pub async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let message = format!("{} does not take {method}", uri.path());
    HttpError(
        StatusCode::METHOD_NOT_ALLOWED,
        ApiError::new(ErrorKind::InvalidArgument, message),
    )
    .into_response()
}

fn http_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::UnknownSession => StatusCode::NOT_FOUND,
        ErrorKind::SessionExpiring => StatusCode::GONE,
        ErrorKind::Busy | ErrorKind::WaitTimeout => StatusCode::LOCKED,
        ErrorKind::NotHolder | ErrorKind::StaleToken | ErrorKind::WaitCancelled => {
            StatusCode::CONFLICT
        }
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::LimitReached => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::NotLeader | ErrorKind::Unavailable | ErrorKind::Overloaded => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::NeedsUpgrade => StatusCode::PRECONDITION_FAILED,
        ErrorKind::Compacted => StatusCode::GONE,
    }
}

/// An error response; the status normally follows from the kind, but a body
/// the server could not read keeps the status axum chose (413, 415, ...).
pub(crate) struct HttpError(StatusCode, ApiError);

impl From<ApiError> for HttpError {
    fn from(err: ApiError) -> Self {
        HttpError(http_status(err.kind), err)
    }
}

impl From<BytesRejection> for HttpError {
    fn from(rejection: BytesRejection) -> Self {
        if timed_out(&rejection) {
            let message = "the request body stalled: send it whole within the server's \
                           --body-read-timeout";
            return HttpError(
                StatusCode::REQUEST_TIMEOUT,
                ApiError::new(ErrorKind::InvalidArgument, message),
            );
        }
        HttpError(
            rejection.status(),
            ApiError::new(ErrorKind::InvalidArgument, rejection.body_text()),
        )
    }
}

/// Whether reading a body failed because it stalled past the body timeout.
fn timed_out(rejection: &BytesRejection) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(err) = cause {
        if err.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = err.source();
    }
    false
}

impl From<QueryRejection> for HttpError {
    fn from(rejection: QueryRejection) -> Self {
        HttpError(
            rejection.status(),
            ApiError::new(ErrorKind::InvalidArgument, rejection.body_text()),
        )
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let HttpError(status, err) = self;
        let mut body = serde_json::json!({
            "error": { "kind": err.kind.as_str(), "message": err.message }
        });
        if let Some(leader) = err.leader {
            body["error"]["leader"] = leader.into();
        }
        let mut response = (status, Json(body)).into_response();
        if err.kind == ErrorKind::Overloaded {
            // A hint for generic HTTP clients; ours back off with jitter.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

type Reply<T> = Result<Json<T>, HttpError>;

/// A JSON request body, whatever Content-Type the client sent, so that a
/// plain `curl -d '{...}'` works. Oversized bodies are refused by axum's
/// default 2 MB limit before parsing.
///
/// Strict, because a typo must not change meaning: an unknown field
/// (`"wiat": true` would silently make a blocking acquire non-blocking) and
/// anything after the JSON document are refused, naming what was wrong.
/// New fields come with new API versions (`/v2/...`), never silently.
struct JsonBody<T>(T);

#[axum::async_trait]
impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &S) -> Result<Self, HttpError> {
        let bytes = Bytes::from_request(request, state).await?;
        parse_body(&bytes).map(JsonBody).map_err(HttpError::from)
    }
}

/// A request body as `T`, strictly (see [`JsonBody`]).
fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // No body at all: every field takes its default, as with `{}`.
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        bytes
    };
    let invalid = |problem: String| {
        let message = format!("the request body is not valid JSON for this call: {problem}");
        ApiError::new(ErrorKind::InvalidArgument, message)
    };
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let mut unknown = Vec::new();
    // The path names the offending field: "session_id: invalid type...".
    let mut note_unknown = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
    let value = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
        &mut json,
        &mut note_unknown,
    ))
    .map_err(|err| invalid(err.to_string()))?;
    json.end().map_err(|_| {
        invalid("something follows the JSON document (one object per request)".into())
    })?;
    if !unknown.is_empty() {
        return Err(invalid(format!(
            "unknown field {} (check the spelling; docs/http-api.md lists each call's fields)",
            unknown.join(", ")
        )));
    }
    Ok(value)
}

async fn open_session(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<OpenSessionRequest>,
) -> Reply<OpenSessionResponse> {
    Ok(Json(api.open_session(&credentials, request).await?))
}

async fn keep_alive(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<KeepAliveRequest>,
) -> Reply<KeepAliveResponse> {
    Ok(Json(api.keep_alive(&credentials, request).await?))
}

async fn close_session(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<CloseSessionRequest>,
) -> Reply<CloseSessionResponse> {
    Ok(Json(api.close_session(&credentials, request).await?))
}

async fn acquire(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AcquireRequest>,
) -> Reply<AcquireResponse> {
    Ok(Json(api.acquire(&credentials, request).await?))
}

async fn release(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<ReleaseRequest>,
) -> Reply<ReleaseResponse> {
    Ok(Json(api.release(&credentials, request).await?))
}

async fn acquire_permits(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AcquirePermitsRequest>,
) -> Reply<AcquirePermitsResponse> {
    Ok(Json(api.acquire_permits(&credentials, request).await?))
}

async fn campaign(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<CampaignRequest>,
) -> Reply<CampaignResponse> {
    Ok(Json(api.campaign(&credentials, request).await?))
}

async fn proclaim(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<ProclaimRequest>,
) -> Reply<ProclaimResponse> {
    Ok(Json(api.proclaim(&credentials, request).await?))
}

async fn leader(
    State(api): State<Api>,
    credentials: Credentials,
    query: Result<Query<LeaderRequest>, QueryRejection>,
) -> Reply<LeaderResponse> {
    let Query(request) = query?;
    Ok(Json(api.leader(&credentials, request).await?))
}

/// `GET /v1/watch`'s query: a [`WatchRequest`], and how long a long poll
/// waits for an event.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    #[serde(default)]
    name: String,
    #[serde(default)]
    prefix: bool,
    #[serde(default)]
    after: String,
    timeout_ms: Option<u64>,
}

/// A watch as Server-Sent Events: each event with its id (resume after it
/// with `Last-Event-ID`) and its kind as the SSE event name; a last
/// `compacted` or `error` event when the watch ends.
fn server_sent_events(
    watch: crate::api::Watch,
) -> Sse<impl futures::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    let events = watch.into_stream().flat_map(|answer| {
        let events: Vec<SseEvent> = match answer {
            Ok(answer) => match answer.compacted {
                Some(compacted) => vec![SseEvent::default()
                    .event("compacted")
                    .json_data(compacted)
                    .expect("a message encodes as JSON")],
                None => answer
                    .events
                    .into_iter()
                    .map(|event| {
                        SseEvent::default()
                            .id(&event.id)
                            .event(&event.kind)
                            .json_data(&event)
                            .expect("a message encodes as JSON")
                    })
                    .collect(),
            },
            // The `compacted` event before it said all there is to say.
            Err(err) if err.kind == ErrorKind::Compacted => Vec::new(),
            Err(err) => vec![SseEvent::default()
                .event("error")
                .json_data(serde_json::json!({ "kind": err.kind.as_str(), "message": err.message }))
                .expect("JSON encodes as JSON")],
        };
        futures::stream::iter(events.into_iter().map(Ok))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// How long a long poll waits for an event by default, and at most.
const WATCH_POLL_DEFAULT: std::time::Duration = std::time::Duration::from_secs(30);
const WATCH_POLL_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// A watch: Server-Sent Events if the client accepts `text/event-stream`
/// (resumed from its `Last-Event-ID`), otherwise a long poll that answers
/// with the first events, or with none after `timeout_ms`.
async fn watch(
    State(api): State<Api>,
    credentials: Credentials,
    headers: HeaderMap,
    query: Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let Query(query) = query?;
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let streaming = header("accept").is_some_and(|accept| accept.contains("text/event-stream"));
    let request = WatchRequest {
        name: query.name,
        prefix: query.prefix,
        // A reconnecting EventSource says where it stopped.
        after: header("last-event-id").map_or(query.after, str::to_owned),
    };
    let mut watch = api.watch(&credentials, request).await?;
    if streaming {
        return Ok(server_sent_events(watch).into_response());
    }
    let wait = query
        .timeout_ms
        .map_or(WATCH_POLL_DEFAULT, std::time::Duration::from_millis)
        .min(WATCH_POLL_MAX);
    let answer = match tokio::time::timeout(wait, watch.next()).await {
        Ok(answer) => answer?,
        Err(_) => WatchResponse {
            cursor: watch.cursor(),
            ..Default::default()
        },
    };
    Ok(match &answer.compacted {
        Some(compacted) => {
            let err = compacted_error(compacted);
            let body = serde_json::json!({
                "error": {
                    "kind": err.kind.as_str(),
                    "message": err.message,
                    "kept_after": compacted.kept_after,
                    "current_index": compacted.current_index,
                }
            });
            (http_status(err.kind), Json(body)).into_response()
        }
        None => Json(answer).into_response(),
    })
}

async fn define_semaphore(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<DefineSemaphoreRequest>,
) -> Reply<SemaphoreStatusResponse> {
    Ok(Json(api.define_semaphore(&credentials, request).await?))
}

async fn delete_semaphore(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<DeleteSemaphoreRequest>,
) -> Reply<SemaphoreStatusResponse> {
    Ok(Json(api.delete_semaphore(&credentials, request).await?))
}

async fn semaphore_status(
    State(api): State<Api>,
    credentials: Credentials,
    query: Result<Query<SemaphoreStatusRequest>, QueryRejection>,
) -> Reply<SemaphoreStatusResponse> {
    let Query(request) = query?;
    Ok(Json(api.semaphore_status(&credentials, request).await?))
}

async fn lock_status(
    State(api): State<Api>,
    credentials: Credentials,
    query: Result<Query<LockStatusRequest>, QueryRejection>,
) -> Reply<LockStatusResponse> {
    let Query(request) = query?;
    Ok(Json(api.lock_status(&credentials, request).await?))
}

async fn list_locks(
    State(api): State<Api>,
    credentials: Credentials,
    query: Result<Query<ListLocksRequest>, QueryRejection>,
) -> Reply<ListLocksResponse> {
    let Query(request) = query?;
    Ok(Json(api.list_locks(&credentials, request).await?))
}

async fn check_token(
    State(api): State<Api>,
    credentials: Credentials,
    query: Result<Query<CheckTokenRequest>, QueryRejection>,
) -> Reply<CheckTokenResponse> {
    let Query(request) = query?;
    Ok(Json(api.check_token(&credentials, request).await?))
}

async fn lock_history(
    State(api): State<Api>,
    credentials: Credentials,
    query: Result<Query<LockHistoryRequest>, QueryRejection>,
) -> Reply<LockHistoryResponse> {
    let Query(request) = query?;
    Ok(Json(api.lock_history(&credentials, request).await?))
}

async fn store_put(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<StorePutRequest>,
) -> Reply<StorePutResponse> {
    Ok(Json(api.store_put(&credentials, request).await?))
}

/// `GET /v1/store/get?key=K`: a plain read. A fenced read changes the key's
/// fence, so it is a POST.
async fn store_get_plain(
    State(api): State<Api>,
    credentials: Credentials,
    query: Result<Query<KeyQuery>, QueryRejection>,
) -> Reply<StoreGetResponse> {
    let Query(KeyQuery { key }) = query?;
    let request = StoreGetRequest {
        key,
        ..Default::default()
    };
    Ok(Json(api.store_get(&credentials, request).await?))
}

#[derive(serde::Deserialize)]
struct KeyQuery {
    key: String,
}

async fn store_get(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<StoreGetRequest>,
) -> Reply<StoreGetResponse> {
    Ok(Json(api.store_get(&credentials, request).await?))
}

async fn store_delete(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<StoreDeleteRequest>,
) -> Reply<StoreDeleteResponse> {
    Ok(Json(api.store_delete(&credentials, request).await?))
}

async fn cluster_status(State(api): State<Api>) -> Json<ClusterStatusResponse> {
    Json(api.cluster_status().await)
}

async fn add_member(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AddMemberRequest>,
) -> Reply<ClusterStatusResponse> {
    Ok(Json(api.add_member(&credentials, request).await?))
}

async fn remove_member(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<RemoveMemberRequest>,
) -> Reply<ClusterStatusResponse> {
    Ok(Json(api.remove_member(&credentials, request).await?))
}

async fn limits(State(api): State<Api>) -> Json<LimitsResponse> {
    Json(api.limits())
}

async fn set_limits(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<SetLimitsRequest>,
) -> Reply<LimitsResponse> {
    Ok(Json(api.set_limits(&credentials, request).await?))
}

/// 200 while this node leads and serves; 503 otherwise (for load balancers).
async fn health(State(api): State<Api>) -> (StatusCode, Json<HealthResponse>) {
    let health = api.health();
    let status = if health.leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health))
}

/// Ready for clients: a member of a cluster with a known leader
/// (`readiness.rs`). 200 with `{"ready": true}`, or 503 with why not.
async fn ready(State(api): State<Api>) -> (StatusCode, Json<serde_json::Value>) {
    match api.readiness() {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({ "ready": true }))),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "ready": false, "reason": why })),
        ),
    }
}

/// The Prometheus scrape (see docs/operations.md).
async fn metrics(
    State(api): State<Api>,
    credentials: Credentials,
) -> Result<impl IntoResponse, HttpError> {
    let content_type = [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)];
    Ok((content_type, api.metrics(&credentials).await?))
}

async fn acl_bootstrap(
    State(api): State<Api>,
    credentials: Credentials,
) -> Reply<AclTokenResponse> {
    Ok(Json(api.acl_bootstrap(&credentials).await?))
}

async fn acl_whoami(State(api): State<Api>, credentials: Credentials) -> Reply<WhoAmIResponse> {
    Ok(Json(api.acl_whoami(&credentials).await?))
}

async fn acl_show(State(api): State<Api>, credentials: Credentials) -> Reply<AclShowResponse> {
    Ok(Json(api.acl_show(&credentials).await?))
}

async fn acl_create_token(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclCreateTokenRequest>,
) -> Reply<AclTokenResponse> {
    Ok(Json(api.acl_create_token(&credentials, request).await?))
}

async fn acl_revoke_token(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclRevokeTokenRequest>,
) -> Reply<AclChangedResponse> {
    Ok(Json(api.acl_revoke_token(&credentials, request).await?))
}

async fn acl_put_role(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclRole>,
) -> Reply<AclChangedResponse> {
    Ok(Json(api.acl_put_role(&credentials, request).await?))
}

async fn acl_delete_role(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclDeleteRoleRequest>,
) -> Reply<AclChangedResponse> {
    Ok(Json(api.acl_delete_role(&credentials, request).await?))
}

async fn acl_grant_role(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclRoleBinding>,
) -> Reply<AclChangedResponse> {
    Ok(Json(api.acl_grant_role(&credentials, request).await?))
}

async fn acl_revoke_role(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclRoleBinding>,
) -> Reply<AclChangedResponse> {
    Ok(Json(api.acl_revoke_role(&credentials, request).await?))
}

async fn acl_deny_identity(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclIdentityName>,
) -> Reply<AclChangedResponse> {
    Ok(Json(api.acl_deny_identity(&credentials, request).await?))
}

async fn acl_allow_identity(
    State(api): State<Api>,
    credentials: Credentials,
    JsonBody(request): JsonBody<AclIdentityName>,
) -> Reply<AclChangedResponse> {
    Ok(Json(api.acl_allow_identity(&credentials, request).await?))
}

/// The bearer token and client certificate of an HTTP request.
#[axum::async_trait]
impl<S: Send + Sync> FromRequestParts<S> for Credentials {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Credentials::new(
            parts
                .headers
                .get(header::AUTHORIZATION)
                .map(|value| value.as_bytes()),
            parts.extensions.get::<TlsClient>(),
        ))
    }
}

/// `GET /v1/snapshot`: the backup file, `application/octet-stream`; errors
/// as every HTTP call's (`not_leader` with the leader's address from a
/// follower). Needs the `admin` permission.
async fn serve_snapshot(State(api): State<Api>, credentials: Credentials) -> Response {
    match api.snapshot(&credentials).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(err) => HttpError::from(err).into_response(),
    }
}

/// Untrusted bytes in, an answer out, never a panic: random bodies for every
/// call that takes one. (`cargo test -p deadbolt-server untrusted`; see
/// docs/security.md for a longer run.)
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overloaded_is_a_503_that_says_when_to_retry() {
        let overloaded = ApiError::new(ErrorKind::Overloaded, "the queue is full");
        let response = HttpError::from(overloaded).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let refused = ApiError::new(ErrorKind::LimitReached, "too many");
        let response = HttpError::from(refused).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(!response.headers().contains_key(header::RETRY_AFTER));
    }

    fn every_body(bytes: &[u8]) {
        let _ = parse_body::<OpenSessionRequest>(bytes);
        let _ = parse_body::<KeepAliveRequest>(bytes);
        let _ = parse_body::<CloseSessionRequest>(bytes);
        let _ = parse_body::<AcquireRequest>(bytes);
        let _ = parse_body::<ReleaseRequest>(bytes);
        let _ = parse_body::<StorePutRequest>(bytes);
        let _ = parse_body::<StoreGetRequest>(bytes);
        let _ = parse_body::<StoreDeleteRequest>(bytes);
        let _ = parse_body::<AddMemberRequest>(bytes);
        let _ = parse_body::<RemoveMemberRequest>(bytes);
        let _ = parse_body::<AclCreateTokenRequest>(bytes);
        let _ = parse_body::<AclRevokeTokenRequest>(bytes);
        let _ = parse_body::<AclRole>(bytes);
        let _ = parse_body::<AclDeleteRoleRequest>(bytes);
        let _ = parse_body::<AclRoleBinding>(bytes);
        let _ = parse_body::<AclIdentityName>(bytes);
    }

    /// Every query string a GET call parses, as axum's `Query` does.
    fn every_query(query: &str) {
        let Ok(uri) = format!("/v1/x?{query}").parse::<Uri>() else {
            return;
        };
        let _ = Query::<LockStatusRequest>::try_from_uri(&uri);
        let _ = Query::<ListLocksRequest>::try_from_uri(&uri);
        let _ = Query::<CheckTokenRequest>::try_from_uri(&uri);
        let _ = Query::<LockHistoryRequest>::try_from_uri(&uri);
        let _ = Query::<KeyQuery>::try_from_uri(&uri);
    }

    proptest! {
        #[test]
        fn untrusted_http_bodies_of_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            every_body(&bytes);
        }

        #[test]
        fn untrusted_query_strings_never_panic(query in r#"[a-z_=&%0-9A-F+.\-]{0,96}"#) {
            every_query(&query);
        }

        #[test]
        fn untrusted_http_bodies_of_json_like_text_never_panic(text in r#"[{}\[\]":,0-9a-z_ \-.e+]{0,96}"#) {
            every_body(text.as_bytes());
        }
    }

    #[test]
    fn a_body_is_refused_for_an_unknown_field_or_trailing_bytes_naming_them() {
        let err = parse_body::<AcquireRequest>(br#"{"lock":"a","wiat":true}"#).unwrap_err();
        assert!(
            err.message.contains("unknown field wiat"),
            "{}",
            err.message
        );
        let err = parse_body::<AcquireRequest>(br#"{"lock":"a"} {}"#).unwrap_err();
        assert!(err.message.contains("something follows"), "{}", err.message);
        let ok = parse_body::<AcquireRequest>(b"  ").unwrap();
        assert_eq!(ok.lock, "");
    }
}
