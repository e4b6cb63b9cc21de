//! Nodes run inside another program, with no sockets: the deterministic
//! simulation (`crates/sim`) builds whole clusters from these, on one thread
//! and tokio's paused clock.
//!
//! An [`EmbeddedNode`] is the same [`Node`] that `deadbolt server` serves:
//! the same Raft, storage, proposer, leases and operations. Only three
//! things are handed in instead of taken from the host: the disk (a
//! [`SimulatedDisk`]: a redb storage backend), the network (an openraft
//! network factory), and the [`Clock`]; and the [`Api`] over it takes its
//! session secrets from a [`SecretSource`] the program chooses (the
//! simulation seeds it). [`client_routes`] serves that `Api` to real
//! clients over whatever byte streams the program provides.

pub use crate::api::Api;
pub use crate::auth::{Credentials, InFlight};
pub use crate::clock::Clock;
pub use crate::frames::FramedCalls;
pub use crate::grpc::client_routes;
pub use crate::node::{ApiError, Node};
pub use crate::raft_types::{Batch, NodeId, Raft, TypeConfig};
pub use crate::runtime::{seed_node_rng, PauseGate};
pub use crate::secret::SecretSource;
use crate::store::StorageIo;
pub use crate::store::{SimulatedDisk, SimulatedDisks, SimulatedSegments};
use crate::{open_node, raft_config, spawn_duties, NodeRun, QueueLimits, RaftTiming, Transport};
use anyhow::Context;
use deadbolt_core::FeatureLevel;
use openraft::network::RaftNetworkFactory;
use openraft::BasicNode;
use std::collections::BTreeMap;
use tokio::sync::watch;

pub struct EmbeddedNode {
    node: Node,
    stop: watch::Sender<bool>,
}

impl EmbeddedNode {
    /// Opens the node's data on `disks` (refused like a data directory if
    /// it is not ours, damaged or behind its witness) and starts it. Every
    /// task it runs is behind `gate`: shut it to pause the node.
    pub async fn start<N: RaftNetworkFactory<TypeConfig>, D: SimulatedDisk>(
        id: NodeId,
        timing: RaftTiming,
        snapshot_every: u64,
        clock: Clock,
        disks: &SimulatedDisks<D>,
        network: N,
        gate: &PauseGate,
    ) -> anyhow::Result<EmbeddedNode> {
        let data = crate::store::open_simulated_disk(disks, id)?;
        let config = raft_config(snapshot_every, timing)?;
        let run = NodeRun {
            clock,
            io: StorageIo::Inline,
            queue: QueueLimits::DEFAULT,
            feature_level: FeatureLevel::NEWEST,
        };
        // Its peers' messages are handed to its Raft directly: there is no
        // peer service to authenticate for.
        let transport = Transport {
            tls: None,
            peer_secrets: None,
            in_process: true,
        };
        gate.enclose(async move {
            let node = open_node(id, config, data, network, run, transport).await?;
            let (stop, stopped) = watch::channel(false);
            spawn_duties(&node, stopped);
            Ok(EmbeddedNode { node, stop })
        })
        .await
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// For delivering peers' Raft messages and reading its metrics.
    pub fn raft(&self) -> &Raft {
        &self.node.raft
    }

    /// Forms a new cluster of `members` (id and address), from this node.
    pub async fn initialize(&self, members: BTreeMap<NodeId, String>) -> anyhow::Result<()> {
        let members: BTreeMap<NodeId, BasicNode> = members
            .into_iter()
            .map(|(id, address)| (id, BasicNode::new(address)))
            .collect();
        self.node
            .raft
            .initialize(members)
            .await
            .context("cannot initialize the cluster")
    }

    /// Stops the node as a crash would: from now on it does nothing on its
    /// own, and its blocked acquires end. What its disk keeps is up to the
    /// disk: the simulation restarts the node from what was synced.
    pub async fn crash(self) {
        let _ = self.stop.send(true);
        self.node.waits.close();
        let _ = self.node.raft.shutdown().await;
    }
}
