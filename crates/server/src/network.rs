//! Raft transport between nodes: openraft's RPCs over gRPC.
//!
//! Peers talk on the same port as clients (the `deadbolt.v1.RaftPeer`
//! service). Each payload is the openraft request or result, bincode-encoded,
//! because both ends run the same Deadbolt build and openraft's own types
//! already define what must cross the wire. [`PeerConnection`] is the sending
//! side; [`PeerService`] the receiving one, behind the gate of
//! `auth/peers.rs`. Without TLS every call carries the cluster secret.

use crate::auth::peers::{PeerSecrets, SECRET_HEADER};
use crate::raft_types::{NodeId, Raft, TypeConfig};
use crate::tls::NodeTls;
use deadbolt_proto::v1::raft_peer_client::RaftPeerClient;
use deadbolt_proto::v1::raft_peer_server::RaftPeer;
use deadbolt_proto::v1::RaftPayload;
use deadbolt_proto::MAX_MESSAGE_BYTES;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ServerState, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// A peer that does not accept a connection within this is reported
/// unreachable; openraft then backs off before trying it again.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// HTTP/2 pings on idle peer connections notice one that a partition has
/// silently cut, so the next RPC dials afresh instead of waiting on it.
const PING_INTERVAL: Duration = Duration::from_secs(1);
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// Creates connections to peers. openraft asks for a new one per
/// replication stream and per leadership check (several a second under
/// linearizable reads), so the channels are shared: one HTTP/2 connection
/// per peer, multiplexed, instead of a TCP handshake per check.
pub struct PeerNetwork {
    channels: SharedChannels,
    /// The first pause after a failed call; see [`PeerConnection::backoff`].
    first_retry: Duration,
    /// With TLS, peers are dialled over https and shown this node's
    /// certificate.
    tls: Option<Arc<NodeTls>>,
    /// Without TLS, every call carries the cluster secret.
    secrets: Option<Arc<PeerSecrets>>,
}

impl PeerNetwork {
    /// `heartbeat` is the leader's heartbeat interval: after a failed
    /// call, a peer is tried again that soon.
    pub fn new(
        heartbeat: Duration,
        tls: Option<Arc<NodeTls>>,
        secrets: Option<Arc<PeerSecrets>>,
    ) -> Self {
        PeerNetwork {
            channels: SharedChannels::default(),
            first_retry: heartbeat,
            tls,
            secrets,
        }
    }
}

/// Each peer's channel, the address it dials, and when it was dialled.
type SharedChannels = Arc<Mutex<HashMap<NodeId, (String, Channel, Instant)>>>;

/// A connection to one peer.
pub struct PeerConnection {
    target: NodeId,
    first_retry: Duration,
    node: BasicNode,
    channels: SharedChannels,
    tls: Option<Arc<NodeTls>>,
    secrets: Option<Arc<PeerSecrets>>,
    /// `Err` holds why the peer's address is unusable; every call reports it.
    client: Result<RaftPeerClient<Channel>, String>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        let cached = self
            .channels
            .lock()
            .expect("channel cache poisoned")
            .get(&target)
            .filter(|(address, ..)| *address == node.addr)
            .map(|(_, channel, _)| channel.clone());
        let mut connection = PeerConnection {
            target,
            first_retry: self.first_retry,
            node: node.clone(),
            channels: self.channels.clone(),
            tls: self.tls.clone(),
            secrets: self.secrets.clone(),
            client: Err(String::new()),
        };
        match cached {
            Some(channel) => connection.client = Ok(peer_client(channel)),
            None => connection.redial(),
        }
        connection
    }
}

fn peer_client(channel: Channel) -> RaftPeerClient<Channel> {
    RaftPeerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// A node's address as members list it (`host:port`) as a gRPC endpoint:
/// over https, showing this node's certificate, when the node runs TLS.
pub fn peer_endpoint(address: &str, tls: Option<&NodeTls>) -> Result<Endpoint, String> {
    let invalid = |err: tonic::transport::Error| format!("invalid peer address {address:?}: {err}");
    let peer_tls = tls.and_then(NodeTls::peer_config);
    let scheme = if peer_tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(invalid)?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_TIMEOUT)
        .keep_alive_while_idle(true);
    match peer_tls {
        Some(config) => endpoint.tls_config(config).map_err(invalid),
        None => Ok(endpoint),
    }
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl PeerConnection {
    /// Replaces the (shared) channel to this peer with a new one, dialled
    /// lazily. After a timeout the old connection may be a dead TCP stream
    /// that would swallow every later request too.
    fn redial(&mut self) {
        self.client = peer_endpoint(&self.node.addr, self.tls.as_deref()).map(|endpoint| {
            let channel = endpoint.connect_lazy();
            self.channels
                .lock()
                .expect("channel cache poisoned")
                .insert(
                    self.target,
                    (self.node.addr.clone(), channel.clone(), Instant::now()),
                );
            peer_client(channel)
        });
    }

    /// After a call that timed out: [`redial`](Self::redial), unless the
    /// peer's channel was dialled less than [`CONNECT_TIMEOUT`] ago, by this
    /// connection or another to the same peer. That one may still be
    /// connecting: a TLS handshake on a loaded machine can take longer than
    /// a heartbeat's RPC deadline, and replacing the channel throws the
    /// handshake away. With every call timing out, no connection would ever
    /// be made (a CI run of the nemesis over mutual TLS, debug build: every
    /// peer "no answer within 50ms" for 30 s after the faults, no leader).
    fn redial_unless_connecting(&mut self) {
        let connecting = self
            .channels
            .lock()
            .expect("channel cache poisoned")
            .get(&self.target)
            .filter(|(address, _, dialled)| {
                *address == self.node.addr && dialled.elapsed() < CONNECT_TIMEOUT
            })
            .map(|(_, channel, _)| channel.clone());
        match connecting {
            Some(channel) => self.client = Ok(peer_client(channel)),
            None => self.redial(),
        }
    }

    /// Sends one request and decodes the peer's `Result`. Transport trouble
    /// becomes `Unreachable` (peer down: back off) or `Network` (anything
    /// else); the peer's own refusal comes back as a `RemoteError`.
    async fn send<Req, Resp, E, Fut>(
        &mut self,
        request: &Req,
        option: &RPCOption,
        call: impl FnOnce(RaftPeerClient<Channel>, tonic::Request<RaftPayload>) -> Fut,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
        Fut: Future<Output = Result<tonic::Response<RaftPayload>, tonic::Status>>,
    {
        let client = match &self.client {
            Ok(client) => client.clone(),
            Err(reason) => return Err(unreachable(self.target, reason)),
        };
        let data = bincode::serialize(request)
            .map_err(|err| RPCError::Network(NetworkError::new(&err)))?;
        let payload = peer_request(data, self.tls.as_deref(), self.secrets.as_deref());
        let reply = tokio::time::timeout(option.hard_ttl(), call(client, payload)).await;
        let Ok(reply) = reply else {
            self.redial_unless_connecting();
            return Err(too_slow(self.target, option.hard_ttl()));
        };
        let payload = match reply {
            Ok(response) => response.into_inner(),
            // Whatever the transport says (refused, reset, a proxy that
            // lost its backend), the peer did not answer: openraft should
            // back off rather than retry at once.
            Err(status) => {
                self.redial();
                return Err(unreachable(
                    self.target,
                    &format!(
                        "{} ({:?}, {})",
                        status.message(),
                        status.code(),
                        self.node.addr
                    ),
                ));
            }
        };
        let result: Result<Resp, E> = bincode::deserialize(&payload.data)
            .map_err(|err| RPCError::Network(NetworkError::new(&err)))?;
        result.map_err(|err| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                err,
            ))
        })
    }
}

/// A payload to send a peer, carrying the cluster secret when there is no
/// TLS (over TLS the certificate speaks for this node).
fn peer_request(
    data: Vec<u8>,
    tls: Option<&NodeTls>,
    secrets: Option<&PeerSecrets>,
) -> tonic::Request<RaftPayload> {
    let mut request = tonic::Request::new(RaftPayload { data });
    if let (Some(secrets), None) = (secrets, tls) {
        request
            .metadata_mut()
            .insert(SECRET_HEADER, secrets.sending());
    }
    request
}

/// Asks the follower at `address` to stand for election at once (the
/// `TimeoutNow` call), as the leader whose vote is `leader_vote`: see
/// `handover.rs`. Waits at most `wait` for its answer.
pub async fn ask_to_stand(
    address: &str,
    tls: Option<&NodeTls>,
    secrets: Option<&PeerSecrets>,
    leader_vote: &Vote<NodeId>,
    wait: Duration,
) -> Result<(), String> {
    let endpoint = peer_endpoint(address, tls)?.timeout(wait);
    let data = bincode::serialize(leader_vote).map_err(|err| err.to_string())?;
    peer_client(endpoint.connect_lazy())
        .timeout_now(peer_request(data, tls, secrets))
        .await
        .map(drop)
        .map_err(|status| format!("{address}: {} ({:?})", status.message(), status.code()))
}

fn unreachable<E: std::error::Error>(
    target: NodeId,
    reason: &str,
) -> RPCError<NodeId, BasicNode, E> {
    let reason = std::io::Error::other(format!("node {target} is not reachable: {reason}"));
    RPCError::Unreachable(Unreachable::new(&reason))
}

/// A peer that took the call and did not answer within its deadline (in
/// openraft 0.9 an append's is one heartbeat interval, its fsync included):
/// most often alive but slow, a loaded follower or one that just started.
/// Tried again at the next heartbeat, as after openraft's own timeout, not
/// after a backoff: while the leader backs off the follower hears nothing,
/// and a pause that doubles with each slow answer made a slow follower
/// stand for election, or left a new leader unable to commit its first
/// entry for seconds (the failover test, debug build on two loaded cores:
/// seven appends in a row over 50 ms, 2 s to commit, a 5 s lease lost).
/// A peer that is down refuses the connection: that one backs off.
fn too_slow<E: std::error::Error>(
    target: NodeId,
    deadline: Duration,
) -> RPCError<NodeId, BasicNode, E> {
    let reason = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("node {target} did not answer within {deadline:?}"),
    );
    RPCError::Network(NetworkError::new(&reason))
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.send(&rpc, &option, |mut client, payload| async move {
            client.append_entries(payload).await
        })
        .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.send(&rpc, &option, |mut client, payload| async move {
            client.install_snapshot(payload).await
        })
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.send(&rpc, &option, |mut client, payload| async move {
            client.vote(payload).await
        })
        .await
    }

    /// How long the leader waits before calling an unreachable peer again:
    /// a heartbeat interval, then two. While it waits the peer gets no
    /// heartbeat, so a wait plus the call's own deadline (one heartbeat)
    /// must stay within the election timeout (3 heartbeats at least), or a
    /// peer that comes back stands for election before it hears from the
    /// leader, and its higher term deposes it. openraft's default, 500 ms
    /// at once, turned one slow first call into an election (a CI run's 3
    /// fresh nodes changed leader twice in their first second); so did a
    /// wait doubling to 500 ms, which a killed node restarted to (the
    /// backoff lasts until a call succeeds) and which a restarted node
    /// slower than a heartbeat never saw end (the failover test, CI).
    fn backoff(&self) -> Backoff {
        Backoff::new(retry_pauses(self.first_retry))
    }
}

/// Pauses between calls to a peer that stays unreachable: `first`, then
/// twice that. A dead peer costs a refused connection (or one dial per
/// [`CONNECT_TIMEOUT`], see `redial_unless_connecting`) every two
/// heartbeats.
fn retry_pauses(first: Duration) -> impl Iterator<Item = Duration> + Send + 'static {
    std::iter::once(first).chain(std::iter::repeat(first.saturating_mul(2)))
}

/// The receiving side: decodes a peer's request, hands it to the local Raft,
/// and returns its `Result` whole, refusals included.
pub struct PeerService {
    raft: Raft,
    /// While forming a cluster (see `cluster::form`), the node's "ready to
    /// join" flag: until it is set, the node takes no part in Raft. An
    /// emptied node that answered a leader's appends would report its log
    /// going backwards, which openraft treats as a bug. `None`: not forming.
    ready_to_join: Option<Arc<AtomicBool>>,
}

impl PeerService {
    /// Served behind [`crate::auth::peers::PeerGate`], which has checked
    /// who calls before any request reaches these handlers.
    pub fn new(raft: Raft, ready_to_join: Option<Arc<AtomicBool>>) -> Self {
        PeerService {
            raft,
            ready_to_join,
        }
    }

    #[allow(clippy::result_large_err)]
    fn check_taking_part(&self) -> Result<(), tonic::Status> {
        let ready = self.ready_to_join.as_ref();
        if ready.is_none_or(|ready| ready.load(Ordering::SeqCst)) {
            Ok(())
        } else {
            Err(tonic::Status::unavailable(
                "this node has an empty data directory and has not yet made sure it may join the cluster",
            ))
        }
    }
}

// The error is what tonic's handlers return anyway.
#[allow(clippy::result_large_err)]
fn decode<T: DeserializeOwned>(request: tonic::Request<RaftPayload>) -> Result<T, tonic::Status> {
    decode_message(&request.into_inner().data)
}

/// A peer's message from its bytes (`untrusted.rs` lists it).
#[allow(clippy::result_large_err)]
pub(crate) fn decode_message<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, tonic::Status> {
    bincode::deserialize(bytes).map_err(|err| {
        tonic::Status::invalid_argument(format!(
            "cannot decode the raft message (is the peer running the same Deadbolt version?): {err}"
        ))
    })
}

#[allow(clippy::result_large_err)]
fn encode<T: Serialize>(result: &T) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
    let data = bincode::serialize(result)
        .map_err(|err| tonic::Status::internal(format!("cannot encode the raft reply: {err}")))?;
    Ok(tonic::Response::new(RaftPayload { data }))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        self.check_taking_part()?;
        encode(&self.raft.append_entries(decode(request)?).await)
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        self.check_taking_part()?;
        encode(&self.raft.vote(decode(request)?).await)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        self.check_taking_part()?;
        encode(&self.raft.install_snapshot(decode(request)?).await)
    }

    /// Stands for election at once, when asked by the leader this node
    /// follows (the vote it sends is the one this node holds). A stale or
    /// stray request changes nothing; an election it starts is an
    /// ordinary one, which Raft's vote rules keep safe.
    async fn timeout_now(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        self.check_taking_part()?;
        let leader_vote: Vote<NodeId> = decode(request)?;
        let (state, vote) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.state, metrics.vote)
        };
        if state != ServerState::Follower || vote != leader_vote {
            return Err(tonic::Status::failed_precondition(format!(
                "not standing for election: this node is a {state:?} with vote {vote}, and the \
                 request came with vote {leader_vote}"
            )));
        }
        tracing::info!(leader = %leader_vote, "standing for election at the leader's request");
        self.raft
            .trigger()
            .elect()
            .await
            .map_err(|fatal| tonic::Status::unavailable(fatal.to_string()))?;
        encode(&())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConnectionLimits, QueueLimits, RaftTiming, Server, ServerConfig, StartMembership};
    use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
    use openraft::Vote;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::net::{TcpListener, TcpStream};

    // Issue 58, part 1: a peer's Raft messages with their lengths made
    // huge (a peer that knows the secret, or a node certificate's holder,
    // can send anything).
    #[test]
    fn every_length_in_a_raft_message_is_bounded() {
        use crate::raft_types::Batch;
        use deadbolt_core::{Command, SessionId};
        use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, SnapshotMeta};
        let log_id = |index| LogId::new(CommittedLeaderId::new(2, 1), index);
        let batch = Batch {
            commands: vec![Command::CloseSession {
                session: SessionId(7),
            }]
            .into(),
            at_ms: 1,
        };
        let append = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(4)),
            entries: vec![Entry {
                log_id: log_id(5),
                payload: EntryPayload::Normal(batch),
            }],
            leader_commit: Some(log_id(4)),
        };
        let snapshot = InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new_committed(2, 1),
            meta: SnapshotMeta {
                last_log_id: Some(log_id(4)),
                last_membership: Default::default(),
                snapshot_id: "2-1-4".into(),
            },
            offset: 0,
            data: vec![1, 2, 3, 4, 5, 6, 7, 8],
            done: true,
        };
        let vote = VoteRequest::<NodeId>::new(Vote::new(3, 2), Some(log_id(4)));
        use crate::huge_lengths::assert_every_length_bounded as bounded;
        use crate::untrusted;
        let bytes = bincode::serialize(&append).unwrap();
        bounded("an append", &bytes, untrusted::raft_append);
        let bytes = bincode::serialize(&snapshot).unwrap();
        bounded("a snapshot chunk", &bytes, untrusted::raft_snapshot_chunk);
        let bytes = bincode::serialize(&vote).unwrap();
        bounded("a vote", &bytes, untrusted::raft_vote);
    }

    #[test]
    fn an_unreachable_peer_is_called_again_before_it_could_stand_for_election() {
        let millis = |first: u64| -> Vec<u128> {
            retry_pauses(Duration::from_millis(first))
                .take(7)
                .map(|pause| pause.as_millis())
                .collect()
        };
        assert_eq!(millis(50), [50, 100, 100, 100, 100, 100, 100]);
        assert_eq!(millis(200), [200, 400, 400, 400, 400, 400, 400]);
    }

    /// Forwards each connection to `target`, but only `delay` after
    /// accepting it: a peer whose handshake takes that long. Returns its
    /// address and how many connections it has accepted.
    async fn slow_to_connect_proxy(
        target: std::net::SocketAddr,
        delay: Duration,
    ) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let mut server = TcpStream::connect(target).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        (address, accepted)
    }

    /// A CI run of the nemesis over mutual TLS (debug build) ended with no
    /// leader: every peer call "no answer within 50ms" for 30 s. A TLS
    /// handshake on that loaded machine took longer than a heartbeat's
    /// 50 ms deadline, and each timed-out call replaced the peer's channel
    /// with a new one, throwing the handshake away; no connection was ever
    /// made. Here the peer is a real node behind a proxy that makes every
    /// connection take 200 ms, and every call has 50 ms: the calls that
    /// time out must leave the connection to finish, so that a later call
    /// is answered over it.
    #[tokio::test]
    async fn nemesis_secure_no_leader_a_peer_slower_to_connect_than_a_call_deadline_is_reached() {
        let data = tempfile::tempdir().unwrap();
        // A node waiting to join serves peers (a single node would refuse
        // them all), who show it the cluster secret.
        let secret = data.path().join("peer-secret");
        std::fs::write(&secret, crate::secret::new_peer_secret()).unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let server = Server::start(ServerConfig {
            node_id: 1,
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data.path().join("data"),
            snapshot_every: ServerConfig::DEFAULT_SNAPSHOT_EVERY,
            membership: StartMembership::Join,
            timing: RaftTiming::default(),
            limits: ConnectionLimits::DEFAULT,
            queue: QueueLimits::DEFAULT,
            tls: None,
            insecure: false,
            peer_secret_file: Some(secret.clone()),
            feature_level: crate::FeatureLevel::NEWEST,
        })
        .await
        .unwrap();
        let (proxy, connections) =
            slow_to_connect_proxy(server.local_addr().unwrap(), Duration::from_millis(200)).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));

        let secrets = PeerSecrets::load(&secret).unwrap();
        let mut network = PeerNetwork::new(
            RaftTiming::default().heartbeat,
            None,
            Some(Arc::new(secrets)),
        );
        let mut peer = network
            .new_client(1, &BasicNode::new(proxy.to_string()))
            .await;
        let deadline = RPCOption::new(Duration::from_millis(50));
        // A vote from a node the cluster does not know: the node answers
        // it, which is all this needs.
        let vote = VoteRequest::new(Vote::new(0, 2), None);
        const CALLS: usize = 40;
        let mut timed_out = 0;
        let answered = loop {
            match peer.vote(vote.clone(), deadline.clone()).await {
                Ok(answer) => break answer,
                // No answer within the deadline: tried again without a
                // backoff (see `too_slow`).
                Err(RPCError::Network(why)) => {
                    timed_out += 1;
                    assert!(
                        timed_out < CALLS,
                        "no answer in {CALLS} calls over {} connections: {why}",
                        connections.load(Ordering::SeqCst)
                    );
                }
                Err(other) => panic!("the node did not answer the vote: {other}"),
            }
        };
        eprintln!("answered {answered:?}");
        assert!(timed_out > 0, "the proxy's delay made no call time out");
        let _ = stop.send(());
        serving.await.unwrap().unwrap();
    }

    /// A peer connection's bytes are untrusted until decoded: any payload
    /// gives a message or `invalid_argument`, never a panic or an unbounded
    /// allocation (bincode reads lengths against the bytes it was given).
    fn decode_all(data: Vec<u8>) {
        use crate::untrusted;
        untrusted::raft_append(&data);
        untrusted::raft_vote(&data);
        untrusted::raft_snapshot_chunk(&data);
    }

    proptest! {
        #[test]
        fn untrusted_peer_messages_of_random_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
            decode_all(data);
        }

        /// Lengths near the top of u64 up front, where a careless decoder
        /// would try to allocate them.
        #[test]
        fn untrusted_peer_messages_claiming_huge_lengths_never_allocate_them(
            prefix in prop::collection::vec(any::<u8>(), 0..24),
            tail in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut data = prefix;
            data.extend_from_slice(&[0xff; 8]);
            data.extend(tail);
            decode_all(data);
        }
    }
}
