//! Any node serves any client: a follower forwards the client calls that
//! need the leader to it, and the leader takes them as the caller's own.
//!
//! Why: behind a load balancer (a Kubernetes Service, haproxy) two calls in
//! three land on a follower, and the leader's address that `not_leader`
//! names may be one the client cannot reach (a pod address behind the
//! Service). etcd and Consul followers forward for the same reason.
//!
//! How: in front of the router, before anything is decoded. A call of the
//! client API (every gRPC service but a node's own status and the peer
//! service, and the HTTP API under `/v1/`, but for `/v1/cluster/status`)
//! that reaches a node which knows another node leads goes to that leader
//! as it came, bearer token included, streamed both ways (the `Calls`
//! stream and watches too), over a connection this node opens the way it
//! opens its peer connections. Three headers go with it:
//! - [`FORWARDED_BY`], this node's id: the leader serves the call itself and
//!   never forwards it again (a leader that lost its lead meanwhile answers
//!   `not_leader` with the new leader, which the client follows);
//! - [`FORWARDED_CERTIFICATE`], the name on the caller's TLS client
//!   certificate, if it showed one: the leader cannot see that certificate;
//! - without TLS, the cluster secret, as on every peer call.
//!
//! The answer goes back with the leader's address in `deadbolt-leader`,
//! the `not_leader` hint, so that a client that can reach the leader may
//! send its next calls there itself (a hop shorter: on the 2-core machine
//! of `docs/performance.md`, a forwarded pair costs 0.69-0.82x the
//! throughput of a direct one).
//!
//! Access control decides on the leader, exactly as for a call made there:
//! the leader has applied every rule, where the follower may lag behind one
//! (a token revoked a moment ago). The leader takes the forwarded identity
//! only from a connection that passes the peer gate (`auth/peers.rs`: a node
//! certificate over TLS, the cluster secret without); any other call that
//! claims to be forwarded is refused with `permission_denied`.
//!
//! Bounded: at most [`MAX_FORWARDED_IN_FLIGHT`] calls and streams in flight
//! from one node; past that, and while no leader is known, a call is served
//! here, that is answered `not_leader` with the leader's address as before
//! forwarding existed. Gated: a follower forwards only once the cluster
//! version is at [`FeatureLevel::FORWARDING`], as a leader of release 0.1.0
//! would take a forwarded call for the forwarding node's own.

use crate::auth::peers::{PeerGate, RemoteAddr, FORWARDED_BY, SECRET_HEADER};
use crate::http::HttpError;
use crate::metrics::Forwarded;
use crate::network::peer_endpoint;
use crate::node::{ApiError, Node};
use crate::raft_types::NodeId;
use crate::tls::{NodeTls, TlsClient};
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderName, HeaderValue};
use axum::http::HeaderMap;
use axum::http::Version;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use deadbolt_core::FeatureLevel;
use deadbolt_proto::{ErrorKind, LEADER_KEY};
use http_body::Frame;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::Channel;
use tower::ServiceExt;

/// The name on the TLS client certificate the caller showed the forwarding
/// node, if any.
pub const FORWARDED_CERTIFICATE: &str = "deadbolt-forwarded-certificate";

/// Forwarded calls and streams in flight from one node, at most. They
/// share one HTTP/2 connection to the leader, which takes 1,024 streams on
/// one connection by default (`--max-streams-per-connection`): past that,
/// a call would wait for a stream to end, and a watch or `Calls` stream may
/// not end for hours. So a little below it; a node past it answers
/// `not_leader` with the leader's address, as before forwarding.
pub const MAX_FORWARDED_IN_FLIGHT: usize = 1000;

/// Headers that describe one HTTP/1.1 connection, not the request: they
/// must not cross to the leader's HTTP/2 connection (HTTP/2 forbids them).
const CONNECTION_HEADERS: [HeaderName; 6] = [
    header::CONNECTION,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// The state of the forwarding layer (one per node).
pub struct Forwarder {
    node: Node,
    gate: PeerGate,
    leader: LeaderChannel,
    slots: Arc<Semaphore>,
}

impl Forwarder {
    pub fn new(node: Node, gate: PeerGate) -> Arc<Forwarder> {
        Arc::new(Forwarder {
            node,
            gate,
            leader: LeaderChannel::default(),
            slots: Arc::new(Semaphore::new(MAX_FORWARDED_IN_FLIGHT)),
        })
    }

    /// The leader to forward to: another node, known, and a cluster version
    /// that says it takes forwarded calls.
    fn leader_elsewhere(&self) -> Option<(NodeId, String)> {
        let metrics = self.node.raft.metrics();
        let (leader, address) = {
            let metrics = metrics.borrow();
            let leader = metrics.current_leader.filter(|id| *id != self.node.id)?;
            let member = metrics.membership_config.membership().get_node(&leader)?;
            (leader, member.addr.clone())
        };
        (self.node.cluster_version() >= FeatureLevel::FORWARDING).then_some((leader, address))
    }

    /// The connection to the leader at `address`, and which dial made it.
    fn channel_to(&self, address: &str) -> Result<(u64, Channel), String> {
        let tls = self.node.tls.as_deref();
        let tls_reloads = tls.map_or(0, NodeTls::reloads);
        self.leader.get(address, tls_reloads, || {
            Ok(peer_endpoint(address, tls)?.connect_lazy())
        })
    }

    /// Takes a call another node forwarded as its caller's: the identity
    /// comes from [`FORWARDED_CERTIFICATE`], never from the connection's
    /// node certificate. Refused unless that connection is a peer's.
    fn accept(&self, request: &mut Request) -> Result<(), ApiError> {
        let secret = request
            .headers()
            .get(SECRET_HEADER)
            .and_then(|value| value.to_str().ok());
        self.gate
            .admit(
                request.extensions().get::<TlsClient>(),
                secret,
                request.extensions().get::<RemoteAddr>().copied(),
            )
            .map_err(|why| {
                ApiError::new(
                    ErrorKind::PermissionDenied,
                    format!("only the cluster's nodes may forward calls ({FORWARDED_BY}): {why}"),
                )
            })?;
        let certificate = request
            .headers()
            .get(FORWARDED_CERTIFICATE)
            .map(|name| String::from_utf8_lossy(name.as_bytes()).into_owned());
        let extensions = request.extensions_mut();
        match certificate {
            Some(name) => {
                extensions.insert(TlsClient {
                    name: Some(name),
                    node: false,
                });
            }
            None => {
                extensions.remove::<TlsClient>();
            }
        }
        Ok(())
    }

    /// Sends `request` to the leader at `address` and hands back its answer,
    /// holding `slot` until the answer's body ends.
    async fn forward(
        &self,
        mut request: Request,
        (leader, address): (NodeId, String),
        slot: OwnedSemaphorePermit,
    ) -> Response {
        let grpc = is_grpc(&request);
        let failed = |why: String| {
            self.node.metrics.call_forwarded(Forwarded::Failed);
            let err = ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "this node forwards calls to the leader, node {leader} at {address}, and that \
                     failed: {why}; the call may or may not have been done there (every call is \
                     safe to repeat)"
                ),
            );
            error_response(grpc, err)
        };
        let (dial, channel) = match self.channel_to(&address) {
            Ok(kept) => kept,
            Err(why) => return failed(why),
        };
        let client = request
            .extensions()
            .get::<TlsClient>()
            .and_then(|client| client.name.clone());
        let headers = request.headers_mut();
        for name in &CONNECTION_HEADERS {
            headers.remove(name);
        }
        if headers.get(header::TE).is_some_and(|te| te != "trailers") {
            headers.remove(header::TE);
        }
        headers.remove(FORWARDED_CERTIFICATE);
        headers.remove(SECRET_HEADER);
        headers.insert(FORWARDED_BY, HeaderValue::from(self.node.id));
        if let Some(name) = client.and_then(|name| HeaderValue::from_str(&name).ok()) {
            headers.insert(FORWARDED_CERTIFICATE, name);
        }
        if let Some(secrets) = &self.node.peer_secrets {
            let secret = secrets.sending();
            headers.insert(
                SECRET_HEADER,
                HeaderValue::from_bytes(secret.as_bytes()).expect("a secret is a header value"),
            );
        }
        *request.version_mut() = Version::HTTP_2;
        let request = request.map(tonic::body::boxed);
        // A leader that stopped answering without closing its connections
        // (paused, or cut off from this node) would hold the call until the
        // connection's pings time out. Once another node leads, the call
        // ends here as one whose outcome is unknown, and the caller repeats it.
        let answer = tokio::select! {
            answer = channel.oneshot(request) => answer,
            () = self.leader_replaced(leader) => {
                self.leader.forget(dial);
                return failed(format!("node {leader} stopped answering and another node now leads"));
            }
        };
        match answer {
            Ok(mut response) => {
                self.node.metrics.call_forwarded(Forwarded::Answered);
                // The `not_leader` hint, kept for clients that can reach the
                // leader: they may go there for their next calls, a hop
                // shorter (the Rust client does). On answers only: on an
                // error (a gRPC status in the headers, an HTTP error) the
                // node may have stopped leading, and a hint naming it would
                // send the client back to it while another is elected.
                let answered = response.status().is_success()
                    && !response.headers().contains_key("grpc-status");
                if let (true, Ok(address)) = (answered, HeaderValue::from_str(&address)) {
                    response.headers_mut().insert(LEADER_KEY, address);
                }
                response.map(|body| {
                    Body::new(LeadersAnswer {
                        body,
                        grpc,
                        ended: false,
                        _slot: slot,
                    })
                })
            }
            Err(err) => {
                self.leader.forget(dial);
                if never_sent(&err) {
                    return self.after_unreachable_leader(leader, &address, grpc).await;
                }
                failed(err.to_string())
            }
        }
    }

    /// Resolves once a leader other than `leader` as this node knew it
    /// leads: another node, or the same one elected again in a later term
    /// (a killed leader restarted quickly may win the next election). Never
    /// while none is elected.
    async fn leader_replaced(&self, leader: NodeId) {
        let mut metrics = self.node.raft.metrics();
        let term = metrics.borrow().current_term;
        // An error means the node is shutting down: the call ends with it.
        let _ = metrics
            .wait_for(|metrics| {
                metrics
                    .current_leader
                    .is_some_and(|now| now != leader || metrics.current_term > term)
            })
            .await;
    }

    /// The answer to a call that could not be sent to the leader it knew
    /// (refused, reset while connecting, a failed TLS handshake): the call
    /// had no effect, so the caller may send it again. A dead leader is
    /// replaced within about two election timeouts; this waits for that, at
    /// most [`LEADER_CHANGE_WAIT`], and answers `not_leader` naming the new
    /// leader, or none yet. Clients repeat a `not_leader` call anywhere:
    /// sent here again, it goes to the new leader.
    async fn after_unreachable_leader(&self, gone: NodeId, address: &str, grpc: bool) -> Response {
        self.node
            .metrics
            .call_forwarded(Forwarded::LeaderUnreachable);
        let changed = tokio::time::timeout(LEADER_CHANGE_WAIT, self.leader_replaced(gone)).await;
        tracing::debug!(
            gone,
            elected = changed.is_ok(),
            "the leader could not be reached to forward a call"
        );
        let err = self.node.not_leader(&format!(
            "this node could not reach the leader it knew, node {gone} at {address}, to forward \
             the call; nothing was done"
        ));
        error_response(grpc, err)
    }
}

/// How long a follower that cannot reach the leader it knows waits for the
/// next one before answering `not_leader` without one. After a crash the
/// followers wait out the dead leader's lease (`election_timeout_max`, 300 ms
/// by default) and an election timeout (150-300 ms) before one stands: a new
/// leader in 0.5-0.7 s by default, so 2 s leaves room for a lost election
/// round. The caller's client repeats the call either way.
pub const LEADER_CHANGE_WAIT: Duration = Duration::from_secs(2);

/// Whether a forwarded call failed before any of it left this node: the
/// connection to the leader could not be made. tonic says so only in the
/// error's text (`tcp connect error`, the connector's own), or with the
/// operating system's refusal, which only a connect gets, as a source.
/// Anything else (a reset stream, a connection closed or timed out
/// mid-call) may have reached the leader.
fn never_sent(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(cause) = source {
        let refused = cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused || cause.to_string().contains("tcp connect error") {
            return true;
        }
        source = cause.source();
    }
    false
}

/// The connection to the leader, kept between calls. Dialled again when
/// another node leads, when the TLS files were reloaded (a tonic channel
/// reconnects with the settings it was built with, so it would go on
/// showing a retired certificate), and after a call on it failed (it may
/// be a dead TCP stream).
#[derive(Default)]
struct LeaderChannel {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    current: Option<Dialled>,
    /// Dials so far: names each, so that a failure forgets only its own.
    dials: u64,
}

struct Dialled {
    address: String,
    tls_reloads: u64,
    dial: u64,
    channel: Channel,
}

impl LeaderChannel {
    /// The channel to `address` made with the TLS settings of reload
    /// `tls_reloads`, and which dial made it: the one kept, or a new one
    /// from `connect`.
    fn get(
        &self,
        address: &str,
        tls_reloads: u64,
        connect: impl FnOnce() -> Result<Channel, String>,
    ) -> Result<(u64, Channel), String> {
        let mut kept = self.kept.lock().expect("forwarding channel poisoned");
        if let Some(dialled) = kept.current.as_ref() {
            if dialled.address == address && dialled.tls_reloads == tls_reloads {
                return Ok((dialled.dial, dialled.channel.clone()));
            }
        }
        let channel = connect()?;
        let dial = kept.dials;
        kept.dials += 1;
        kept.current = Some(Dialled {
            address: address.to_owned(),
            tls_reloads,
            dial,
            channel: channel.clone(),
        });
        Ok((dial, channel))
    }

    /// Drops the channel `dial` made if it is still the one kept: a call
    /// that failed after another call redialled leaves the new one.
    fn forget(&self, dial: u64) {
        let mut kept = self.kept.lock().expect("forwarding channel poisoned");
        if kept
            .current
            .as_ref()
            .is_some_and(|dialled| dialled.dial == dial)
        {
            kept.current = None;
        }
    }
}

/// The leader's answer on its way to the caller. It holds its in-flight
/// slot until it ends: a stream holds one for as long as it runs.
struct LeadersAnswer {
    body: tonic::body::BoxBody,
    grpc: bool,
    ended: bool,
    _slot: OwnedSemaphorePermit,
}

impl http_body::Body for LeadersAnswer {
    type Data = Bytes;
    type Error = tonic::Status;

    /// Passes the leader's frames on. If the connection to the leader breaks
    /// (the leader died mid-stream), a gRPC answer ends with `unavailable`
    /// in its trailers, as the leader's own broken connection would read to
    /// a client that had called it: the outcome of what was in flight is
    /// unknown, and the client's retry rules apply. Relayed as is, the
    /// break reached the client as an HTTP/2 `INTERNAL_ERROR` reset, which
    /// the Rust client took for a refusal (found by the load-balancer test).
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
            Some(Err(broken)) if this.grpc => {
                this.ended = true;
                let err = ApiError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "the connection to the leader this node forwarded the call to broke: \
                         {broken}; what was in flight may or may not have been done there"
                    ),
                );
                let mut trailers = HeaderMap::new();
                tonic::Status::from(err)
                    .add_header(&mut trailers)
                    .expect("a status is valid headers");
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            other => Poll::Ready(other),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }
}

/// Whether a call of this path needs the leader: the client API, but for a
/// node's own health and status (what probes and the leader's cluster
/// version checks ask each node).
fn needs_the_leader(path: &str) -> bool {
    let grpc = [
        "/deadbolt.v1.Deadbolt/",
        "/deadbolt.v1.Access/",
        "/deadbolt.v1.Cluster/",
    ]
    .iter()
    .any(|service| path.starts_with(service));
    let own = matches!(
        path,
        "/deadbolt.v1.Deadbolt/Health" | "/deadbolt.v1.Cluster/Status" | "/v1/cluster/status"
    );
    (grpc || path.starts_with("/v1/")) && !own
}

fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|kind| kind.as_bytes().starts_with(b"application/grpc"))
}

/// `err` as the caller's protocol says errors: a gRPC status, or the HTTP
/// API's JSON error.
fn error_response(grpc: bool, err: ApiError) -> Response {
    if grpc {
        tonic::Status::from(err).into_http().map(Body::new)
    } else {
        HttpError::from(err).into_response()
    }
}

/// The middleware: takes a forwarded call as its caller's, forwards a call
/// that needs the leader when another node leads, and serves the rest here.
pub async fn forward_or_serve(
    State(forwarder): State<Arc<Forwarder>>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.headers().contains_key(FORWARDED_BY) {
        return match forwarder.accept(&mut request) {
            Ok(()) => next.run(request).await,
            Err(err) => error_response(is_grpc(&request), err),
        };
    }
    if !needs_the_leader(request.uri().path()) {
        return next.run(request).await;
    }
    let Some(leader) = forwarder.leader_elsewhere() else {
        return next.run(request).await;
    };
    match forwarder.slots.clone().try_acquire_owned() {
        Ok(slot) => forwarder.forward(request, leader, slot).await,
        Err(_) => {
            forwarder.node.metrics.call_forwarded(Forwarded::ServedHere);
            next.run(request).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_own_health_and_status_are_never_forwarded() {
        for own in [
            "/deadbolt.v1.Deadbolt/Health",
            "/deadbolt.v1.Cluster/Status",
            "/v1/cluster/status",
            "/health",
            "/ready",
            "/metrics",
            "/ui/api/cluster",
            "/deadbolt.v1.RaftPeer/AppendEntries",
            "/grpc.health.v1.Health/Check",
        ] {
            assert!(!needs_the_leader(own), "{own}");
        }
        for client_api in [
            "/deadbolt.v1.Deadbolt/Acquire",
            "/deadbolt.v1.Deadbolt/Calls",
            "/deadbolt.v1.Deadbolt/Watch",
            "/deadbolt.v1.Access/WhoAmI",
            "/deadbolt.v1.Cluster/AddMember",
            "/v1/lock/acquire",
            "/v1/acl/whoami",
            "/v1/snapshot",
        ] {
            assert!(needs_the_leader(client_api), "{client_api}");
        }
    }

    // The first half of issue 59: a leader that refused the connection
    // had the call, for the caller, "maybe done" (`unavailable`), and no
    // client repeated it.
    #[tokio::test]
    async fn a_refused_connection_to_the_leader_sent_nothing() {
        let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = refused.local_addr().unwrap();
        drop(refused);
        let channel = peer_endpoint(&address.to_string(), None)
            .unwrap()
            .connect_lazy();
        let request = axum::http::Request::builder()
            .uri(format!("http://{address}/deadbolt.v1.Deadbolt/Acquire"))
            .body(tonic::body::empty_body())
            .unwrap();
        let err = channel.oneshot(request).await.unwrap_err();
        assert!(never_sent(&err), "{err:?}");
        assert!(!never_sent(&std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        )));
    }

    // A channel kept across a SIGHUP that rotated the certificates would
    // reconnect showing the old ones (a bug: the cache was keyed on the
    // address alone, and kept a channel whose calls failed).
    #[tokio::test]
    async fn the_leaders_channel_is_redialled_after_a_tls_reload_or_a_failed_call() {
        let leader = LeaderChannel::default();
        let dials = std::cell::Cell::new(0);
        let get = |address: &str, tls_reloads: u64| {
            let connect = || {
                dials.set(dials.get() + 1);
                Ok(Channel::from_static("http://127.0.0.1:1").connect_lazy())
            };
            leader.get(address, tls_reloads, connect).expect("dials").0
        };
        let first = get("10.0.0.1:7070", 0);
        assert_eq!(get("10.0.0.1:7070", 0), first, "kept between calls");
        assert_eq!(dials.get(), 1);

        let after_reload = get("10.0.0.1:7070", 1);
        assert_ne!(after_reload, first);
        assert_eq!(dials.get(), 2, "redialled with the reloaded certificates");

        let other_leader = get("10.0.0.2:7070", 1);
        assert_eq!(dials.get(), 3, "redialled to another leader");

        leader.forget(after_reload);
        assert_eq!(
            get("10.0.0.2:7070", 1),
            other_leader,
            "an older dial's failure forgets nothing"
        );
        leader.forget(other_leader);
        get("10.0.0.2:7070", 1);
        assert_eq!(dials.get(), 4, "redialled after a failed call");
    }
}
