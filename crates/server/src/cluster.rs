//! Cluster membership: forming a cluster from `--initial-cluster`, and the
//! status, add and remove operations behind `deadbolt cluster`.
//!
//! Forming has one rule that matters for safety: a node whose data directory
//! is empty never joins an *existing* cluster as a voter on its own (see
//! [`form`] for how it tells a new cluster from an existing one). Such a
//! node has forgotten its votes and its log, and a voter with an empty log
//! would vote for any candidate, even one missing committed writes (lost
//! grants, a token handed out twice). It must come back as a new member:
//! removed, then started with `--join` and added again, which makes it a
//! learner until it has caught up.

use crate::auth::peers::PeerAuthentication;
use crate::network::peer_endpoint;
use crate::node::{ApiError, Node};
use crate::raft_types::NodeId;
use crate::tls::NodeTls;
use anyhow::{bail, Context};
use deadbolt_proto::v1::cluster_client::ClusterClient;
use deadbolt_proto::v1::{BuildVersions, ClusterStatusRequest, ClusterStatusResponse, Member};
use deadbolt_proto::ErrorKind;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long forming waits for one peer's answer.
const PEER_QUERY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a membership change waits for an earlier one to finish.
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(10);
/// How long one attempt at a membership change may wait to be committed.
/// openraft answers it when its entries are applied, or refused when a new
/// leader's log replaces them; a leader that lost its leadership in
/// between can leave it unanswered, and a simulated seed (1,011,477) waited
/// out 500 s of simulated time on it.
const MEMBERSHIP_COMMIT_WAIT: Duration = Duration::from_secs(10);
/// How long `cluster add` waits for the new node to hold the whole log
/// before giving up on it. Lock tables are small: a reachable node catches
/// up (snapshot included) in well under a second.
const CATCH_UP_WAIT: Duration = Duration::from_secs(20);
/// Pause between rounds while the first node waits for the others to start.
const FORMING_RETRY: Duration = Duration::from_millis(300);

/// Why a new member's catch-up wait ended before it caught up.
enum CatchUp {
    StoppedLeading,
    ShuttingDown,
    /// [`CATCH_UP_WAIT`] passed.
    NothingReplicated,
}

/// The members a new cluster starts with: `1=host:port,2=host:port,...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialCluster {
    members: BTreeMap<NodeId, String>,
}

impl InitialCluster {
    pub fn address_of(&self, id: NodeId) -> Option<&str> {
        self.members.get(&id).map(String::as_str)
    }

    /// The node that creates the cluster. Exactly one must, and the lowest id
    /// is one every node can work out alone.
    fn founder(&self) -> NodeId {
        *self.members.keys().next().expect("never empty")
    }

    fn peers(&self, me: NodeId) -> impl Iterator<Item = (NodeId, &str)> {
        self.members
            .iter()
            .filter(move |(id, _)| **id != me)
            .map(|(id, address)| (*id, address.as_str()))
    }
}

impl FromStr for InitialCluster {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut members = BTreeMap::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (id, address) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not ID=HOST:PORT"))?;
            let id: NodeId = id
                .trim()
                .parse()
                .map_err(|_| format!("{entry:?}: the node id must be a number"))?;
            let address = address.trim();
            match address.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
                _ => return Err(format!("{entry:?}: the address must be HOST:PORT")),
            }
            if members.contains_key(&id) {
                return Err(format!("node id {id} is listed twice"));
            }
            // Two members at one address would be one node sending Raft
            // to itself as another (a leader's own appends coming back).
            if let Some((other, _)) = members.iter().find(|(_, known)| *known == address) {
                return Err(format!(
                    "nodes {other} and {id} are both given the address {address}: each member \
                     needs its own"
                ));
            }
            members.insert(id, address.to_owned());
        }
        if members.is_empty() {
            return Err("no members given (expected 1=HOST:PORT,2=HOST:PORT,...)".into());
        }
        Ok(InitialCluster { members })
    }
}

impl fmt::Display for InitialCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self
            .members
            .iter()
            .map(|(id, address)| format!("{id}={address}"))
            .collect();
        f.write_str(&entries.join(","))
    }
}

/// Refuses an `--initial-cluster` that does not list this node.
pub fn check_listed(me: NodeId, cluster: &InitialCluster) -> anyhow::Result<()> {
    if cluster.address_of(me).is_none() {
        bail!("--initial-cluster {cluster} does not list this node's id {me} (--node-id)");
    }
    Ok(())
}

/// Takes a node with an empty data directory into a new cluster, while it
/// serves. Two steps, each waiting for an answer from *every* listed peer:
///
/// 1. Any peer already in a cluster means this node lost its data: refuse.
///    None: this node is ready to join, and says so in its status.
/// 2. The founder initializes the cluster once every peer says it is ready
///    to join; the others wait to hear from it.
///
/// A peer is ready only after its own step 1, so no node can see the
/// founder's new cluster during its check and mistake itself for an
/// emptied member. An emptied node waits, refusing to vote, until it hears
/// from every peer, and is then refused: it cannot slip in while the others
/// happen to be down.
pub async fn form(node: &Node, cluster: &InitialCluster) -> anyhow::Result<()> {
    let me = node.id;
    wait_for_peers(
        node,
        cluster,
        "to know whether the cluster already exists",
        |_| true,
    )
    .await?;
    node.ready_to_join.store(true, Ordering::SeqCst);
    if me != cluster.founder() {
        tracing::info!(
            founder = cluster.founder(),
            "empty data directory, no cluster formed yet: waiting for the founding node"
        );
        return Ok(());
    }
    wait_for_peers(node, cluster, "to be ready to join", |status| {
        status.ready_to_join
    })
    .await?;
    let members = cluster
        .members
        .iter()
        .map(|(id, address)| (*id, BasicNode::new(address)))
        .collect::<BTreeMap<_, _>>();
    node.raft
        .initialize(members)
        .await
        .context("cannot initialize the cluster")?;
    tracing::info!(members = %cluster, "formed a new cluster");
    Ok(())
}

/// Asks every peer until all answer and pass `ready`; refuses as soon as
/// one turns out to be in a formed cluster.
async fn wait_for_peers(
    node: &Node,
    cluster: &InitialCluster,
    waiting_for: &str,
    ready: impl Fn(&ClusterStatusResponse) -> bool,
) -> anyhow::Result<()> {
    let mut last_report: Option<std::time::Instant> = None;
    loop {
        let answers = query_peers(cluster, node.id, node.tls.as_deref()).await;
        refuse_if_formed(node.id, &answers)?;
        let missing: Vec<NodeId> = answers
            .iter()
            .filter(|(_, answer)| !answer.as_ref().is_ok_and(&ready))
            .map(|(id, _)| *id)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if last_report.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
            tracing::info!(?missing, "waiting for every listed node {waiting_for}");
            last_report = Some(std::time::Instant::now());
        }
        tokio::time::sleep(FORMING_RETRY).await;
    }
}

type PeerAnswers = Vec<(NodeId, Result<ClusterStatusResponse, String>)>;

async fn query_peers(cluster: &InitialCluster, me: NodeId, tls: Option<&NodeTls>) -> PeerAnswers {
    let queries = cluster
        .peers(me)
        .map(|(id, address)| async move { (id, query_status(address, tls).await) });
    futures::future::join_all(queries).await
}

/// One node's `Cluster.Status`, or why it could not be had.
pub async fn query_status(
    address: &str,
    tls: Option<&NodeTls>,
) -> Result<ClusterStatusResponse, String> {
    let endpoint = peer_endpoint(address, tls)?.timeout(PEER_QUERY_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|err| format!("{address}: {err}"))?;
    ClusterClient::new(channel)
        .status(ClusterStatusRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("{address}: {}", status.message()))
}

fn refuse_if_formed(me: NodeId, answers: &PeerAnswers) -> anyhow::Result<()> {
    let Some((peer, status)) = answers.iter().find_map(|(id, answer)| {
        answer
            .as_ref()
            .ok()
            .filter(|s| s.initialized)
            .map(|s| (id, s))
    }) else {
        return Ok(());
    };
    bail!(
        "this node's data directory is empty, but the cluster it is listed in already exists \
         (node {peer} is a member, in term {}). A node that lost its data must not vote again: \
         it could elect a leader that is missing committed writes. To bring node {me} back: \
         `deadbolt cluster remove {me}`, restart it with `--join` instead of `--initial-cluster`, \
         then `deadbolt cluster add {me} ADDRESS`",
        status.term
    )
}

impl Node {
    /// This node's role and indexes, and the membership as it knows it.
    pub async fn cluster_status(&self) -> ClusterStatusResponse {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| Member {
                node_id: *id,
                address: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let role = match metrics.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        ClusterStatusResponse {
            node_id: self.id,
            // Unknown counts as formed: a joining node then refuses. A
            // member of a membership is formed without asking Raft, whose
            // core may be waiting for a full disk (`store/disk_space.rs`).
            initialized: membership.nodes().next().is_some()
                || self.raft.is_initialized().await.unwrap_or(true),
            ready_to_join: self.ready_to_join.load(Ordering::SeqCst),
            role: role.to_owned(),
            leader_id: metrics.current_leader,
            term: metrics.current_term,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            applied_index: metrics.last_applied.map_or(0, |id| id.index),
            members,
            transport_security: match &self.tls {
                Some(tls) if tls.mutual() => "mutual-tls",
                Some(_) => "tls",
                None => "none",
            }
            .to_owned(),
            peer_authentication: self.peer_authentication().as_str().to_owned(),
            versions: Some(BuildVersions {
                feature_level: self.feature_level.0,
                ..crate::version::build_versions()
            }),
            cluster_version: self.cluster_version().0,
            disk_full: self.space.is_full(),
            access_control: self
                .table
                .read()
                .expect("state lock poisoned")
                .table
                .acl()
                .enabled(),
        }
    }

    pub fn peer_authentication(&self) -> PeerAuthentication {
        if self.in_process_peers {
            return PeerAuthentication::InProcess;
        }
        PeerAuthentication::of(self.tls.as_deref(), self.peer_secrets.as_deref())
    }

    /// Adds `id` as a learner, waits until it has caught up, then makes it
    /// a voter. A node that never catches up (not started, not started with
    /// `--join`, a wrong address) is taken out again and never votes: a
    /// voter that cannot answer would count against the quorum, and on a
    /// single node would stop every write.
    ///
    /// Adding is idempotent, as `consul join` is: adding a member again at
    /// the address it is listed at finishes what an earlier add began (a
    /// learner left behind when the leader changed during its catch-up),
    /// or changes nothing. That is why losing leadership mid-add answers
    /// `NotLeader`: the client sends the same add to the new leader, which
    /// finishes it. A member listed at another address is refused: openraft
    /// would keep the old address and report the add done.
    pub async fn add_member(&self, id: NodeId, address: &str) -> Result<(), ApiError> {
        if let Err(reason) = peer_endpoint(address, self.tls.as_deref()) {
            return Err(ApiError::new(ErrorKind::InvalidArgument, reason));
        }
        // A member it could not authenticate would be a door left open.
        if self.peer_authentication() == PeerAuthentication::Unavailable {
            let fix = if self.tls.is_some() {
                "restart it with --tls-client-ca (its members authenticate with node certificates that CA signed)"
            } else {
                "restart it with --peer-secret-file (`deadbolt peer-secret new FILE` makes one; every node gets the same file), or with TLS"
            };
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                format!("this node has no way for its peers to authenticate, so it takes no members in: {fix}"),
            ));
        }
        let sharing = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            let other = membership
                .nodes()
                .find(|(other, node)| **other != id && node.addr == address)
                .map(|(other, _)| *other);
            other
        };
        if let Some(other) = sharing {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "node {other} is already a member at {address}: each member needs its own \
                     address (is the new node's listen address a copy of node {other}'s?)"
                ),
            ));
        }
        self.check_supports_cluster_version(id, address).await?;
        // Not openraft's blocking wait: it counts a learner as caught up
        // once it is within `replication_lag_threshold` (5000) entries of
        // the leader, which a node that was never reached always is on a
        // young cluster.
        let added = self
            .change_membership(|| self.raft.add_learner(id, BasicNode::new(address), false))
            .await?;
        let listed = added
            .membership
            .as_ref()
            .and_then(|membership| membership.get_node(&id))
            .map(|node| node.addr.as_str());
        if let Some(listed) = listed.filter(|listed| *listed != address) {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "node {id} is already a member, at {listed}: to move it to {address}, \
                     `deadbolt cluster remove {id}` first, then add it again"
                ),
            ));
        }
        match self.wait_caught_up(id, added.log_id.index).await {
            Ok(()) => {}
            Err(CatchUp::StoppedLeading) => {
                return Err(self.not_leader(&format!(
                    "this node stopped leading while node {id} caught up (it is listed as a \
                     learner, without a vote); the same add sent to the new leader finishes it"
                )))
            }
            Err(CatchUp::ShuttingDown) => {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!("this node is shutting down; node {id} is listed as a learner, without a vote: add it again to finish"),
                ))
            }
            Err(CatchUp::NothingReplicated) => {
                let nodes = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
                let removed = self
                    .change_membership(|| self.raft.change_membership(nodes.clone(), false))
                    .await;
                let left = match removed {
                    Ok(_) => "it was not added",
                    Err(_) => {
                        "it is still listed as a learner (no vote): `deadbolt cluster remove` it"
                    }
                };
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "node {id} at {address} did not catch up: nothing replicated to it \
                         within {CATCH_UP_WAIT:?}. Is it running, started with --join, and \
                         reachable at that address from the leader? {left}"
                    ),
                ));
            }
        }
        self.change_membership(|| {
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
        })
        .await?;
        tracing::info!(node_id = id, address, "added a voter");
        Ok(())
    }

    /// Waits until learner `id` holds the log up to `index` (the entry that
    /// made it a learner), as this leader's replication reports it.
    async fn wait_caught_up(&self, id: NodeId, index: u64) -> Result<(), CatchUp> {
        let mut metrics = self.raft.metrics();
        let caught_up = async {
            loop {
                {
                    let now = metrics.borrow_and_update();
                    let Some(replication) = &now.replication else {
                        return Err(CatchUp::StoppedLeading);
                    };
                    let matched = replication.get(&id).cloned().flatten();
                    if matched.is_some_and(|matched| matched.index >= index) {
                        return Ok(());
                    }
                }
                if metrics.changed().await.is_err() {
                    return Err(CatchUp::ShuttingDown);
                }
            }
        };
        // tokio's clock, as everything a node decides by.
        tokio::time::timeout(CATCH_UP_WAIT, caught_up)
            .await
            .unwrap_or(Err(CatchUp::NothingReplicated))
    }

    /// Removes `id` from the cluster altogether.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ApiError> {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        if membership.get_node(&id).is_none() {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                format!("node {id} is not a member of this cluster"),
            ));
        }
        // A voter is removed from the voters (and, not retained, from the
        // nodes); a learner (say, from an interrupted `cluster add`) only
        // from the nodes.
        let ids = BTreeSet::from([id]);
        let change = if membership.voter_ids().any(|voter| voter == id) {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        self.change_membership(|| self.raft.change_membership(change.clone(), false))
            .await?;
        tracing::info!(node_id = id, "removed a member");
        Ok(())
    }

    /// Runs a membership change, again while an earlier one is still
    /// finishing (openraft allows one at a time; a `cluster add` right after
    /// a `cluster remove` would otherwise fail for no reason of its own).
    async fn change_membership<T, Fut>(&self, change: impl Fn() -> Fut) -> Result<T, ApiError>
    where
        Fut: std::future::Future<
            Output = Result<T, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>,
        >,
    {
        // tokio's clock, as everything a node decides by (the simulation
        // pauses it).
        let give_up = tokio::time::Instant::now() + MEMBERSHIP_WAIT;
        loop {
            let Ok(changed) = tokio::time::timeout(MEMBERSHIP_COMMIT_WAIT, change()).await else {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "the membership change was not committed within \
                         {MEMBERSHIP_COMMIT_WAIT:?} (no quorum answers, or leadership moved); \
                         it may still take effect: check `deadbolt cluster status`, then retry"
                    ),
                ));
            };
            match changed {
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(_),
                ))) if tokio::time::Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                result => return result.map_err(|err| self.membership_error(err)),
            }
        }
    }

    fn membership_error(
        &self,
        err: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
    ) -> ApiError {
        match err {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
                self.not_leader("membership changes go to the leader")
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(
                err @ (ChangeMembershipError::EmptyMembership(_)
                | ChangeMembershipError::LearnerNotFound(_)
                | ChangeMembershipError::InProgress(_)),
            )) => ApiError::new(
                ErrorKind::InvalidArgument,
                format!("membership change refused: {err}"),
            ),
            RaftError::Fatal(fatal) => {
                ApiError::new(ErrorKind::Internal, format!("raft has stopped: {fatal}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_members_and_finds_the_founder() {
        let cluster: InitialCluster = "2=127.0.0.1:7072, 1=127.0.0.1:7071,3=db3:7073"
            .parse()
            .unwrap();
        assert_eq!(cluster.founder(), 1);
        assert_eq!(cluster.address_of(3), Some("db3:7073"));
        assert_eq!(
            cluster.to_string(),
            "1=127.0.0.1:7071,2=127.0.0.1:7072,3=db3:7073"
        );
        let peers: Vec<NodeId> = cluster.peers(2).map(|(id, _)| id).collect();
        assert_eq!(peers, [1, 3]);
    }

    #[test]
    fn refuses_malformed_lists() {
        for (text, complaint) in [
            ("", "no members"),
            ("1=a:1,1=b:2", "listed twice"),
            ("1=a:1,1=a:1", "listed twice"),
            (
                "1=a:1,2=a:1",
                "nodes 1 and 2 are both given the address a:1",
            ),
            ("x=a:1", "must be a number"),
            ("1=a", "HOST:PORT"),
            ("1=a:port", "HOST:PORT"),
            ("1", "not ID=HOST:PORT"),
        ] {
            let err = text.parse::<InitialCluster>().unwrap_err();
            assert!(err.contains(complaint), "{text:?}: {err}");
        }
    }
}
