//! In-process nodes for tests on tokio's paused clock: real `EmbeddedNode`s
//! (openraft, the redb stores, proposer, leases, waits, `Api`) on the
//! simulation's disk, joined by a network of plain function calls.
//!
//! Why: what waits, expires or retries (abandonment after its grace, queue
//! places kept for a retry, lease expiry after a leader restart) is decided
//! by the node's timers. On the paused clock a test sets those timers off
//! exactly, in milliseconds of real time, and can say "not before 3 s, by
//! 3.1 s" instead of sleeping through wall-clock windows with margins for a
//! loaded machine. Real processes stay in `crates/cli/tests` for what only
//! they show (signals, kill -9, sockets, the client crate).
//!
//! Nothing here imitates the server: calls go through `Api`, the layer the
//! gRPC and HTTP front ends call. Only the disk, the network and the clock
//! are the test's, as in the simulation (`crates/sim`).

// The simulation's disk, compiled from its own source (`crates/sim` depends
// on this crate, so it cannot be a dependency of this crate's tests).
#[path = "../../../sim/src/disk.rs"]
#[allow(dead_code)] // the simulation uses parts of its disk this harness does not
mod disk;

pub use deadbolt_proto::ErrorKind;
pub use deadbolt_server::embedded::{
    Api, ApiError, Clock, Credentials, EmbeddedNode, InFlight, NodeId, PauseGate, Raft,
    SecretSource, SimulatedDisks, TypeConfig,
};
pub use disk::SimDisk;

use deadbolt_proto::v1::{
    AcquireRequest, KeepAliveRequest, LockState, LockStatusRequest, OpenSessionRequest,
    ReleaseRequest,
};
use deadbolt_server::{ConnectionLimits, RaftTiming};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The Unix time of every test's start (2026-01-01), for the wall clocks.
const EPOCH_MS: u64 = 1_767_225_600_000;
/// Each way of every Raft message.
const LINK_DELAY: Duration = Duration::from_millis(1);

/// The nodes that are up, as the network reaches them.
#[derive(Default)]
pub struct Net {
    nodes: Mutex<BTreeMap<NodeId, Raft>>,
    /// Replication from this node, sent before this time, arrives only then.
    held: Mutex<Option<(NodeId, Instant)>>,
    /// Links that carry nothing, both directions listed.
    cut: Mutex<std::collections::BTreeSet<(NodeId, NodeId)>>,
}

impl Net {
    fn target(&self, id: NodeId) -> Option<Raft> {
        self.nodes.lock().unwrap().get(&id).cloned()
    }

    fn link_up(&self, from: NodeId, to: NodeId) -> bool {
        !self.cut.lock().unwrap().contains(&(from, to))
    }

    /// Cuts every link between the nodes `ids`: none reaches another.
    pub fn cut_all(&self, ids: &[NodeId]) {
        let mut cut = self.cut.lock().unwrap();
        for &a in ids {
            for &b in ids.iter().filter(|&&b| b != a) {
                cut.insert((a, b));
            }
        }
    }

    /// Joins `a` and `b` again, both ways.
    pub fn heal_link(&self, a: NodeId, b: NodeId) {
        let mut cut = self.cut.lock().unwrap();
        cut.remove(&(a, b));
        cut.remove(&(b, a));
    }

    pub fn heal(&self) {
        self.cut.lock().unwrap().clear();
    }

    /// Until `until`, holds back the append-entries from `from` that could
    /// move a follower's known log position (those carrying entries or
    /// naming a position), so that only bare heartbeats get through: a
    /// leadership check then comes back before the log is replicated, as
    /// when a busy link or a slow follower disk delays replication by more
    /// than a heartbeat round.
    pub fn hold_replication(&self, from: NodeId, until: Instant) {
        *self.held.lock().unwrap() = Some((from, until));
    }

    fn hold_for(
        &self,
        from: NodeId,
        request: &AppendEntriesRequest<TypeConfig>,
    ) -> Option<Instant> {
        let (held, until) = (*self.held.lock().unwrap())?;
        let bare = request.entries.is_empty() && request.prev_log_id.is_none();
        (held == from && !bare && Instant::now() < until).then_some(until)
    }
}

/// Node `from`'s way to its peers.
pub struct Link {
    from: NodeId,
    net: Arc<Net>,
}

pub struct Connection {
    from: NodeId,
    target: NodeId,
    node: BasicNode,
    net: Arc<Net>,
}

impl RaftNetworkFactory<TypeConfig> for Link {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Connection {
        Connection {
            from: self.from,
            target,
            node: node.clone(),
            net: self.net.clone(),
        }
    }
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl Connection {
    /// Delivers a request to the target, if it is up, and its answer back.
    async fn send<T, E: std::error::Error, Fut>(
        &self,
        call: impl FnOnce(Raft) -> Fut,
    ) -> RpcResult<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        tokio::time::sleep(LINK_DELAY).await;
        let unreachable = || {
            let why = std::io::Error::other(format!("node {} is down", self.target));
            RPCError::Unreachable(Unreachable::new(&why))
        };
        let raft = (self.net.link_up(self.from, self.target))
            .then(|| self.net.target(self.target))
            .flatten()
            .ok_or_else(unreachable)?;
        let answer = call(raft).await;
        tokio::time::sleep(LINK_DELAY).await;
        if self.net.target(self.from).is_none() || !self.net.link_up(self.target, self.from) {
            return Err(unreachable());
        }
        answer.map_err(|err| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                err,
            ))
        })
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        if let Some(until) = self.net.hold_for(self.from, &rpc) {
            tokio::time::sleep_until(until).await;
        }
        self.send(|raft| async move { raft.append_entries(rpc).await })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.send(|raft| async move { raft.install_snapshot(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.send(|raft| async move { raft.vote(rpc).await }).await
    }
}

struct Slot {
    disks: SimulatedDisks<SimDisk>,
    running: Option<(EmbeddedNode, Api)>,
    /// What its wall clock reads when it next starts, if not true time.
    wall_clock_ms: Option<u64>,
}

/// A cluster of embedded nodes on the paused clock. Every node snapshots
/// only when told to.
pub struct Cluster {
    pub net: Arc<Net>,
    slots: BTreeMap<NodeId, Slot>,
}

impl Cluster {
    /// Starts `size` nodes on blank disks, forms them into one cluster and
    /// waits for a leader.
    pub async fn form(size: u64) -> Cluster {
        deadbolt_server::embedded::seed_node_rng(size);
        let mut cluster = Cluster {
            net: Arc::default(),
            slots: BTreeMap::new(),
        };
        for id in 1..=size {
            cluster.start_blank(id).await;
        }
        let members = (1..=size).map(|id| (id, format!("node-{id}"))).collect();
        cluster.running(1).0.initialize(members).await.unwrap();
        cluster.leader().await;
        cluster
    }

    /// Starts node `id` on a blank disk, in no cluster yet: a node started
    /// with `--join`, waiting to be added.
    pub async fn start_blank(&mut self, id: NodeId) {
        let slot = Slot {
            disks: SimulatedDisks::default(),
            running: None,
            wall_clock_ms: None,
        };
        assert!(self.slots.insert(id, slot).is_none(), "node {id} is known");
        self.start(id).await;
    }

    fn running(&self, id: NodeId) -> &(EmbeddedNode, Api) {
        self.slots[&id].running.as_ref().expect("node is running")
    }

    /// Starts node `id` from what its disk holds.
    pub async fn start(&mut self, id: NodeId) {
        let slot = self.slots.get_mut(&id).expect("known node");
        assert!(slot.running.is_none(), "node {id} is already running");
        let wall_clock_ms = slot.wall_clock_ms.unwrap_or(EPOCH_MS + elapsed_ms());
        let clock = Clock::simulated(1.0, wall_clock_ms);
        let link = Link {
            from: id,
            net: self.net.clone(),
        };
        let node = EmbeddedNode::start(
            id,
            RaftTiming::default(),
            u64::MAX / 2,
            clock,
            &slot.disks,
            link,
            &PauseGate::default(),
        )
        .await
        .expect("the node starts from its disk");
        let api = Api::new(
            node.node().clone(),
            SecretSource::seeded(id),
            InFlight::new(ConnectionLimits::DEFAULT.max_calls_per_identity),
        );
        self.net
            .nodes
            .lock()
            .unwrap()
            .insert(id, node.raft().clone());
        slot.running = Some((node, api));
    }

    /// Crashes node `id`: its blocked calls end, it answers nothing more,
    /// and its disk keeps what was synced (everything acknowledged).
    pub async fn crash(&mut self, id: NodeId) {
        let slot = self.slots.get_mut(&id).expect("known node");
        let (node, _) = slot.running.take().expect("node is running");
        self.net.nodes.lock().unwrap().remove(&id);
        node.crash().await;
        let mut rng = StdRng::seed_from_u64(0);
        slot.disks = slot.disks.map(|disk| disk.after_crash(0.0, &mut rng));
    }

    /// Node `id`'s wall clock reads `unix_ms` from its next start on (its
    /// monotonic clock is untouched): a clock set wrong, or jumped.
    pub fn set_wall_clock(&mut self, id: NodeId, unix_ms: u64) {
        self.slots.get_mut(&id).expect("known node").wall_clock_ms = Some(unix_ms);
    }

    pub async fn restart(&mut self, id: NodeId) {
        self.crash(id).await;
        self.start(id).await;
    }

    pub fn api(&self, id: NodeId) -> Api {
        self.running(id).1.clone()
    }

    /// Node `id`'s disks, shared with it (a fault armed on one reaches the
    /// running node).
    pub fn disks(&self, id: NodeId) -> SimulatedDisks<SimDisk> {
        self.slots[&id].disks.clone()
    }

    pub fn raft(&self, id: NodeId) -> Raft {
        self.running(id).0.raft().clone()
    }

    /// The node that leads and has started serving as leader (its leases
    /// are tracked), once there is one.
    pub async fn leader(&self) -> NodeId {
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let leading = self.slots.iter().find_map(|(&id, slot)| {
                let (_, api) = slot.running.as_ref()?;
                api.health().leader.then_some(id)
            });
            if let Some(id) = leading {
                return id;
            }
            assert!(Instant::now() < give_up, "no leader within 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Milliseconds of (paused) time since the runtime's clock started.
fn elapsed_ms() -> u64 {
    thread_local! {
        static START: Instant = Instant::now();
    }
    START.with(|start| start.elapsed().as_millis() as u64)
}

/// A session opened through `Api`, as a client holds it.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: u64,
    pub secret: String,
}

pub async fn open_session(api: &Api, ttl: Duration) -> Session {
    let opened = api
        .open_session(
            &Credentials::ANONYMOUS,
            OpenSessionRequest {
                ttl_ms: ttl.as_millis() as u64,
            },
        )
        .await
        .expect("a session opens");
    Session {
        id: opened.session_id,
        secret: opened.session_secret,
    }
}

/// A blocking acquire (`wait`), as a client sends it: `attempt` names the
/// request, and its retries reuse it.
pub async fn acquire(
    api: &Api,
    session: &Session,
    lock: &str,
    wait: bool,
    attempt: u64,
) -> Result<u64, ApiError> {
    acquire_within(api, session, lock, wait, None, attempt).await
}

/// [`acquire`], waiting at most `timeout` if given.
pub async fn acquire_within(
    api: &Api,
    session: &Session,
    lock: &str,
    wait: bool,
    timeout: Option<Duration>,
    attempt: u64,
) -> Result<u64, ApiError> {
    let request = AcquireRequest {
        session_id: session.id,
        session_secret: session.secret.clone(),
        lock: lock.to_owned(),
        wait,
        timeout_ms: timeout.map(|timeout| timeout.as_millis() as u64),
        attempt,
        ..AcquireRequest::default()
    };
    let granted = api.acquire(&Credentials::ANONYMOUS, request).await?;
    Ok(granted.token)
}

pub async fn release(api: &Api, session: &Session, lock: &str, token: u64) {
    let request = ReleaseRequest {
        session_id: session.id,
        session_secret: session.secret.clone(),
        lock: lock.to_owned(),
        token,
    };
    api.release(&Credentials::ANONYMOUS, request)
        .await
        .expect("the holder releases");
}

pub async fn keep_alive(api: &Api, session: &Session) -> Result<Duration, ApiError> {
    let request = KeepAliveRequest {
        session_id: session.id,
        session_secret: session.secret.clone(),
    };
    let renewed = api.keep_alive(&Credentials::ANONYMOUS, request).await?;
    Ok(Duration::from_millis(renewed.ttl_ms))
}

/// The lock's holder and queue, after a linearizable barrier.
pub async fn lock_state(api: &Api, lock: &str) -> Option<LockState> {
    let request = LockStatusRequest {
        lock: lock.to_owned(),
    };
    api.lock_status(&Credentials::ANONYMOUS, request)
        .await
        .expect("the leader answers")
        .state
}

/// Waits (on the paused clock) until `lock` has `count` waiters.
pub async fn wait_for_waiters(api: &Api, lock: &str, count: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = lock_state(api, lock)
            .await
            .map_or(0, |state| state.waiter_session_ids.len());
        if waiting >= count {
            return;
        }
        assert!(Instant::now() < give_up, "{lock} never had {count} waiters");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The lines of `api`'s metrics scrape that start with `name `, as a number.
pub async fn metric(api: &Api, name: &str) -> f64 {
    let text = api
        .metrics(&Credentials::ANONYMOUS)
        .await
        .expect("the scrape is open");
    let line = text
        .lines()
        .find(|line| line.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in the scrape"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}
