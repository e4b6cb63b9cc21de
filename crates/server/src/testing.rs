//! What this crate's own tests share: the simulation's disk and a node that
//! needs no peers, both for tests on tokio's paused clock.
//!
//! Why here and not in `crates/sim`: the simulation depends on this crate,
//! so its disk cannot be a dependency of this crate's tests; it is compiled
//! from its own source instead (as `tests/common` does for the integration
//! tests), so both run on the very disk the simulation crashes.

#[allow(dead_code)] // the crash images are the simulation's, not used here
#[path = "../../sim/src/disk.rs"]
pub mod sim_disk;

use crate::embedded::{
    Api, Clock, EmbeddedNode, InFlight, NodeId, PauseGate, SecretSource, SimulatedDisks, TypeConfig,
};
use crate::{ConnectionLimits, RaftTiming};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use sim_disk::SimDisk;
use std::collections::BTreeMap;
use std::time::Duration;

/// The network of a node alone in its cluster: nobody to reach.
pub struct NoPeers;

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

fn unreachable<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    let why = std::io::Error::other("a single-node cluster has no peers");
    RPCError::Unreachable(Unreachable::new(&why))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;

    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> NoPeers {
        NoPeers
    }
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        Err(unreachable())
    }
}

/// A single-node cluster on a blank simulated disk, leading and serving,
/// and the `Api` over it.
pub async fn single_node() -> (EmbeddedNode, Api) {
    let node = EmbeddedNode::start(
        1,
        RaftTiming::default(),
        10_000,
        Clock::simulated(1.0, 1_767_225_600_000),
        &SimulatedDisks::<SimDisk>::default(),
        NoPeers,
        &PauseGate::default(),
    )
    .await
    .expect("a node starts on a blank disk");
    node.initialize(BTreeMap::from([(1, "node-1".to_owned())]))
        .await
        .expect("a single-node cluster forms");
    while !node.node().health().leader {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let api = Api::new(
        node.node().clone(),
        SecretSource::seeded(1),
        InFlight::new(ConnectionLimits::DEFAULT.max_calls_per_identity),
    );
    (node, api)
}
