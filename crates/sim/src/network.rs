//! The simulated network: every message between nodes, and between clients
//! and nodes, crosses the [`Fabric`], which delays it, may drop it, and
//! refuses it when its link is cut or its destination is down.
//!
//! Raft messages are bincode-encoded and decoded on the way, as on the real
//! wire. Delays are drawn per message, so messages overtake each other.
//! A node that crashes while handling a call never answers it.
//!
//! A paused node (a process stopped by a GC or a VM stall) sends nothing
//! and handles nothing until it resumes. Requests sent to it wait in its
//! "socket" and are handled when it resumes, those between nodes even if
//! their sender has given up by then: stale messages arriving late are
//! what a pause adds to a partition. Its own tasks are not polled
//! meanwhile (its `PauseGate` is shut), so its timers fire when it resumes,
//! as a resumed process's do.

use deadbolt_server::embedded::{Api, NodeId, PauseGate, Raft, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use rand::rngs::StdRng;
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::DuplexStream;
use tokio::sync::{mpsc, watch};

/// The address of node `id` in the simulated network.
pub fn address(id: NodeId) -> String {
    format!("sim-node-{id}")
}

/// The node an address names, if it is one of ours.
pub fn node_at(address: &str) -> Option<NodeId> {
    address.strip_prefix("sim-node-")?.parse().ok()
}

/// How messages fare on links that are up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkQuality {
    /// Each message (request or reply) is lost with this probability.
    pub loss: f64,
    pub min_delay: Duration,
    pub max_delay: Duration,
}

impl LinkQuality {
    pub const GOOD: LinkQuality = LinkQuality {
        loss: 0.0,
        min_delay: Duration::from_micros(100),
        max_delay: Duration::from_millis(2),
    };
}

/// A running incarnation of a node, as the network reaches it.
#[derive(Clone)]
pub struct Reachable {
    pub incarnation: u64,
    pub raft: Raft,
    pub api: Api,
    /// Turns true when this incarnation crashes.
    pub crashed: watch::Receiver<bool>,
    /// Where real clients' gRPC connections to it go, in runs with them.
    pub listener: Option<Listener>,
    /// Shut while it is paused: none of its tasks runs.
    pub gate: PauseGate,
}

/// Where a node takes the connections clients open to it (`wire.rs`
/// serves them).
pub type Listener = mpsc::Sender<DuplexStream>;

/// Why a message got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The destination was down or cut off when the message was sent:
    /// certainly nothing happened there (a refused connection).
    Refused,
    /// Sent, but no answer came back: it may or may not have taken effect.
    NoAnswer,
}

pub struct Fabric {
    state: Mutex<FabricState>,
    /// The nodes paused now.
    paused: watch::Sender<BTreeSet<NodeId>>,
}

struct FabricState {
    rng: StdRng,
    nodes: BTreeMap<NodeId, Reachable>,
    /// Node-to-node links that carry nothing (both directions listed).
    cut: BTreeSet<(NodeId, NodeId)>,
    quality: LinkQuality,
}

/// Who sends a message: a node incarnation, or a client (never cut off).
#[derive(Debug, Clone, Copy)]
pub enum Sender {
    Node { id: NodeId, incarnation: u64 },
    Client,
}

/// How long a caller waits before it gives up on a message that was lost in
/// transit (a timeout, for the caller).
const NO_ANSWER_WAIT: Duration = Duration::from_millis(500);

impl Fabric {
    pub fn new(rng: StdRng) -> Arc<Fabric> {
        Arc::new(Fabric {
            state: Mutex::new(FabricState {
                rng,
                nodes: BTreeMap::new(),
                cut: BTreeSet::new(),
                quality: LinkQuality::GOOD,
            }),
            paused: watch::Sender::new(BTreeSet::new()),
        })
    }

    /// Pauses node `id` until [`Fabric::resume`].
    pub fn pause(&self, id: NodeId) {
        if let Some(node) = self.state().nodes.get(&id) {
            node.gate.shut();
        }
        self.paused.send_modify(|paused| {
            paused.insert(id);
        });
    }

    pub fn resume(&self, id: NodeId) {
        self.paused.send_modify(|paused| {
            paused.remove(&id);
        });
        let gate = self.state().nodes.get(&id).map(|node| node.gate.clone());
        if let Some(gate) = gate {
            gate.open();
        }
    }

    /// Returns once node `id` is not paused.
    pub fn running(&self, id: NodeId) -> impl Future<Output = ()> + Send + 'static {
        let mut paused = self.paused.subscribe();
        async move {
            let _ = paused.wait_for(|paused| !paused.contains(&id)).await;
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FabricState> {
        self.state.lock().expect("fabric lock poisoned")
    }

    pub fn node_up(&self, id: NodeId, node: Reachable) {
        self.state().nodes.insert(id, node);
    }

    pub fn node_down(&self, id: NodeId) {
        self.state().nodes.remove(&id);
    }

    /// Cuts every link between the two groups.
    pub fn partition(&self, side: &[NodeId], other: &[NodeId]) {
        let mut state = self.state();
        for &a in side {
            for &b in other {
                state.cut.insert((a, b));
                state.cut.insert((b, a));
            }
        }
    }

    pub fn set_quality(&self, quality: LinkQuality) {
        self.state().quality = quality;
    }

    /// Every link up and good again.
    pub fn heal(&self) {
        let mut state = self.state();
        state.cut.clear();
        state.quality = LinkQuality::GOOD;
    }

    /// The node a message from `from` to `to` reaches now, if any.
    fn route(state: &FabricState, from: Sender, to: NodeId) -> Option<Reachable> {
        if let Sender::Node { id, incarnation } = from {
            let sender_current = state
                .nodes
                .get(&id)
                .is_some_and(|node| node.incarnation == incarnation);
            if !sender_current || state.cut.contains(&(id, to)) {
                return None;
            }
        }
        state.nodes.get(&to).cloned()
    }

    /// The node a message from `from` to node `to` would reach now.
    pub fn reach_node(&self, from: Sender, to: NodeId) -> Option<Reachable> {
        Self::route(&self.state(), from, to)
    }

    /// One leg of a message: its delay, and whether it is lost.
    pub fn draw_leg(&self) -> (Duration, bool) {
        let mut state = self.state();
        let quality = state.quality;
        let delay = state.rng.gen_range(quality.min_delay..=quality.max_delay);
        let lost = quality.loss > 0.0 && state.rng.gen_bool(quality.loss);
        (delay, lost)
    }

    /// Sends a request from `from` to node `to`, has `handle` answer it
    /// there, and carries the answer back.
    pub async fn call<T, Fut>(
        &self,
        from: Sender,
        to: NodeId,
        handle: impl FnOnce(Reachable) -> Fut,
    ) -> Result<T, Lost>
    where
        Fut: Future<Output = T>,
    {
        if let Sender::Node { id, .. } = from {
            self.running(id).await;
        }
        if Self::route(&self.state(), from, to).is_none() {
            tokio::time::sleep(self.draw_leg().0).await;
            return Err(Lost::Refused);
        }
        let (delay, lost) = self.draw_leg();
        tokio::time::sleep(delay).await;
        let target = Self::route(&self.state(), from, to);
        let Some(target) = target.filter(|_| !lost) else {
            tokio::time::sleep(NO_ANSWER_WAIT).await;
            return Err(Lost::NoAnswer);
        };
        // A paused node handles it once it resumes.
        self.running(to).await;
        let mut crashed = target.crashed.clone();
        let answer = tokio::select! {
            biased;
            _ = crashed.wait_for(|crashed| *crashed) => None,
            answer = handle(target.clone()) => Some(answer),
        };
        // A node paused while it handled the call answers once it resumes.
        self.running(to).await;
        let (delay, lost) = self.draw_leg();
        tokio::time::sleep(delay).await;
        // The answer travels back on the same link (cuts are symmetric),
        // from the same incarnation, to a sender that must still be there.
        let back = Self::route(&self.state(), from, to)
            .is_some_and(|node| node.incarnation == target.incarnation);
        match answer {
            Some(answer) if back && !lost => Ok(answer),
            _ => {
                tokio::time::sleep(NO_ANSWER_WAIT).await;
                Err(Lost::NoAnswer)
            }
        }
    }
}

impl Fabric {
    /// [`Fabric::call`] for a message between nodes, which is delivered
    /// even if its sender gives up on the answer (openraft's timeouts drop
    /// the call): a request written to a socket arrives. Late requests that
    /// waited for a paused node to resume are handled this way.
    pub async fn send_detached<T, Fut>(
        self: &Arc<Self>,
        from: Sender,
        to: NodeId,
        handle: impl FnOnce(Reachable) -> Fut + Send + 'static,
    ) -> Result<T, Lost>
    where
        T: Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (answered, answer) = tokio::sync::oneshot::channel();
        let fabric = self.clone();
        tokio::spawn(async move {
            let _ = answered.send(fabric.call(from, to, handle).await);
        });
        answer.await.unwrap_or(Err(Lost::NoAnswer))
    }

    /// A request to the resource, which is always up and never cut off: it
    /// is delayed both ways, and either leg may be lost.
    pub async fn reach<T>(&self, handle: impl FnOnce() -> T) -> Result<T, Lost> {
        let (delay, request_lost) = self.draw_leg();
        tokio::time::sleep(delay).await;
        if request_lost {
            tokio::time::sleep(NO_ANSWER_WAIT).await;
            return Err(Lost::NoAnswer);
        }
        let answer = handle();
        let (delay, reply_lost) = self.draw_leg();
        tokio::time::sleep(delay).await;
        if reply_lost {
            tokio::time::sleep(NO_ANSWER_WAIT).await;
            return Err(Lost::NoAnswer);
        }
        Ok(answer)
    }
}

/// Node `id`'s way to its peers, for openraft.
pub struct SimNetwork {
    pub id: NodeId,
    pub incarnation: u64,
    pub fabric: Arc<Fabric>,
}

pub struct SimConnection {
    from: Sender,
    target: NodeId,
    target_node: BasicNode,
    fabric: Arc<Fabric>,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = SimConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> SimConnection {
        SimConnection {
            from: Sender::Node {
                id: self.id,
                incarnation: self.incarnation,
            },
            target,
            target_node: node.clone(),
            fabric: self.fabric.clone(),
        }
    }
}

/// What the wire does to a message: encode, decode.
fn over_the_wire<T: Serialize + DeserializeOwned>(message: &T) -> T {
    let bytes = bincode::serialize(message).expect("raft messages encode");
    bincode::deserialize(&bytes).expect("raft messages decode")
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl SimConnection {
    async fn send<Req, Resp, E, Fut>(
        &self,
        request: Req,
        handle: impl FnOnce(Raft, Req) -> Fut + Send + 'static,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize + DeserializeOwned + Send + 'static,
        Resp: Serialize + DeserializeOwned + Send + 'static,
        E: std::error::Error + Serialize + DeserializeOwned + Send + 'static,
        Fut: Future<Output = Result<Resp, E>> + Send + 'static,
    {
        let request = over_the_wire(&request);
        let answer = self
            .fabric
            .send_detached(self.from, self.target, |node| async move {
                over_the_wire(&handle(node.raft, request).await)
            })
            .await;
        match answer {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(err)) => Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.target_node.clone(),
                err,
            ))),
            Err(lost) => {
                let reason = std::io::Error::other(format!("node {}: {lost:?}", self.target));
                Err(RPCError::Unreachable(Unreachable::new(&reason)))
            }
        }
    }
}

impl RaftNetwork<TypeConfig> for SimConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.send(
            rpc,
            |raft, rpc| async move { raft.append_entries(rpc).await },
        )
        .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.send(
            rpc,
            |raft, rpc| async move { raft.install_snapshot(rpc).await },
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.send(rpc, |raft, rpc| async move { raft.vote(rpc).await })
            .await
    }
}
