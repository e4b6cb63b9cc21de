//! [`SimCluster`]: the nodes of one simulated run, each a real
//! [`EmbeddedNode`] on a [`SimDisk`], crashed and restarted at will.

use crate::disk::SimDisk;
use crate::network::{address, Fabric, Reachable, SimNetwork};
use deadbolt_server::embedded::{
    Api, Clock, EmbeddedNode, InFlight, NodeId, PauseGate, SecretSource, SimulatedDisks,
};
use deadbolt_server::{ConnectionLimits, RaftTiming};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use tokio::sync::watch;

/// The simulated Unix time at the start of every run (2026-01-01).
pub const EPOCH_MS: u64 = 1_767_225_600_000;
/// Snapshot often, so runs exercise snapshots, compaction and snapshot
/// transfer to a node that fell behind.
const SNAPSHOT_EVERY: u64 = 200;

pub struct SimCluster {
    pub fabric: Arc<Fabric>,
    slots: BTreeMap<NodeId, Slot>,
    incarnations: u64,
    /// Whether restarts may give a node a faulty clock.
    pub clock_faults: bool,
    /// Some node ran with a clock outside the bound that lease timing
    /// assumes (`CLOCK_DRIFT_BOUND`).
    pub clock_faulted: bool,
    /// Session secrets for every node's API, from the seed.
    secrets: SecretSource,
    /// Whether nodes serve gRPC to real clients (`wire.rs`): not in runs
    /// without them, where the service's tasks would move the scheduler's
    /// draws and so change how older seeds run.
    serve_real_clients: bool,
    /// Every disk each crash left, byte for byte: see `crash_digest`.
    crashed_disks: DefaultHasher,
}

/// What a damaged disk lost or changed (`SimCluster::damage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskDamage {
    FlipBits,
    LoseDatabase,
    LoseWitness,
    RollBack,
    /// The snapshot database lost; refused once the log was compacted.
    LoseSnapshots,
    /// The snapshot database back at an earlier crash's image.
    RollBackSnapshots,
}

impl DiskDamage {
    /// Whether a node must refuse to start on the damaged disk. A flipped
    /// bit may fall where nothing is kept, and a rollback may go back to an
    /// identical image: those may start, if they serve what they held (the
    /// history checker judges).
    pub fn must_refuse(self) -> bool {
        matches!(self, DiskDamage::LoseDatabase | DiskDamage::LoseWitness)
    }
}

/// How far a clock's rate may stray from real time for the lease guarantee
/// to hold (docs/safety.md: 2 %).
pub const CLOCK_DRIFT_BOUND: f64 = 0.02;

struct Slot {
    /// One disk per file of a real node's data directory.
    disks: SimulatedDisks<SimDisk>,
    /// The disks as the crash before the latest one left them: what a
    /// rollback goes back to.
    earlier: Option<SimulatedDisks<SimDisk>>,
    latest: Option<SimulatedDisks<SimDisk>>,
    running: Option<Running>,
}

struct Running {
    node: EmbeddedNode,
    crashed: watch::Sender<bool>,
    gate: PauseGate,
}

impl SimCluster {
    /// Starts `size` nodes on blank disks and forms them into one cluster.
    /// Their APIs draw session secrets from `secrets`.
    pub async fn form(
        size: u64,
        clock_faults: bool,
        fabric: Arc<Fabric>,
        secrets: SecretSource,
        serve_real_clients: bool,
    ) -> anyhow::Result<SimCluster> {
        let mut cluster = SimCluster {
            fabric,
            slots: BTreeMap::new(),
            incarnations: 0,
            clock_faults,
            clock_faulted: false,
            secrets,
            serve_real_clients,
            crashed_disks: DefaultHasher::new(),
        };
        for id in 1..=size {
            cluster.slots.insert(
                id,
                Slot {
                    disks: SimulatedDisks::default(),
                    earlier: None,
                    latest: None,
                    running: None,
                },
            );
            cluster.start(id, 1.0).await?;
        }
        let members = (1..=size).map(|id| (id, address(id))).collect();
        let first = cluster.slots[&1].running.as_ref().expect("just started");
        first.node.initialize(members).await?;
        Ok(cluster)
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.slots.keys().copied().collect()
    }

    /// Starts node `id` from its disk, its clock running at `clock_rate`
    /// times real time.
    pub async fn start(&mut self, id: NodeId, clock_rate: f64) -> anyhow::Result<()> {
        self.incarnations += 1;
        let incarnation = self.incarnations;
        self.clock_faulted |= (clock_rate - 1.0).abs() > CLOCK_DRIFT_BOUND;
        let slot = self.slots.get_mut(&id).expect("known node");
        assert!(slot.running.is_none(), "node {id} is already running");
        let clock = Clock::simulated(clock_rate, EPOCH_MS + crate::elapsed().as_millis() as u64);
        let gate = PauseGate::default();
        let network = SimNetwork {
            id,
            incarnation,
            fabric: self.fabric.clone(),
        };
        let node = EmbeddedNode::start(
            id,
            RaftTiming::default(),
            SNAPSHOT_EVERY,
            clock,
            &slot.disks,
            network,
            &gate,
        )
        .await?;
        let (crashed, crashed_rx) = watch::channel(false);
        let api = Api::new(
            node.node().clone(),
            self.secrets.clone(),
            InFlight::new(ConnectionLimits::DEFAULT.max_calls_per_identity),
        );
        self.fabric.node_up(
            id,
            Reachable {
                incarnation,
                raft: node.raft().clone(),
                listener: self
                    .serve_real_clients
                    .then(|| crate::wire::serve(api.clone(), crashed_rx.clone())),
                api,
                crashed: crashed_rx,
                gate: gate.clone(),
            },
        );
        slot.running = Some(Running {
            node,
            crashed,
            gate,
        });
        Ok(())
    }

    /// Crashes node `id`: it is gone from the network at once, and its disk
    /// keeps what was synced plus a random part of the rest.
    pub fn crash(&mut self, id: NodeId, rng: &mut StdRng) {
        let slot = self.slots.get_mut(&id).expect("known node");
        let Some(running) = slot.running.take() else {
            return;
        };
        self.fabric.node_down(id);
        let _ = running.crashed.send(true);
        // A node crashed while paused winds down like any other.
        running.gate.open();
        let keep = rng.gen_range(0.0..=1.0);
        slot.disks = slot.disks.map(|disk| disk.after_crash(keep, rng));
        for disk in [&slot.disks.db, &slot.disks.witness, &slot.disks.snapshots] {
            disk.hash_contents(&mut self.crashed_disks);
        }
        for (number, segment) in slot.disks.log.each() {
            number.hash(&mut self.crashed_disks);
            segment.hash_contents(&mut self.crashed_disks);
        }
        slot.earlier = slot
            .latest
            .replace(slot.disks.map(|disk| disk.synced_image()));
        // Its tasks wind down in the background, cut off from everything;
        // the disk they may still write to is no longer this node's.
        tokio::spawn(running.node.crash());
    }

    /// Loses node `id`'s data: it restarts with a blank disk. Only while it
    /// is down.
    pub fn wipe(&mut self, id: NodeId) {
        let slot = self.slots.get_mut(&id).expect("known node");
        assert!(slot.running.is_none(), "node {id} is running");
        slot.disks = SimulatedDisks::default();
    }

    /// Damages node `id`'s disks while it is down; says what was done.
    pub fn damage(&mut self, id: NodeId, damage: DiskDamage, rng: &mut StdRng) -> String {
        let slot = self.slots.get_mut(&id).expect("known node");
        assert!(slot.running.is_none(), "node {id} is running");
        match damage {
            DiskDamage::FlipBits => {
                let count = rng.gen_range(1..=8);
                let segments = slot.disks.log.each();
                match segments.choose(rng) {
                    Some((number, segment)) if rng.gen_bool(0.5) => {
                        slot.disks
                            .log
                            .replace(*number, segment.with_flipped_bits(count, rng));
                        format!("{count} bits flipped in bytes its log segment {number} holds")
                    }
                    _ => {
                        slot.disks.db = slot.disks.db.with_flipped_bits(count, rng);
                        format!("{count} bits flipped in bytes its database holds")
                    }
                }
            }
            DiskDamage::LoseDatabase => {
                slot.disks.db = SimDisk::default();
                "its database lost (the witness kept)".to_owned()
            }
            DiskDamage::LoseWitness => {
                slot.disks.witness = SimDisk::default();
                "its witness lost (the database kept)".to_owned()
            }
            DiskDamage::RollBack => match &slot.earlier {
                Some(earlier) => {
                    slot.disks.db = earlier.db.synced_image();
                    slot.disks.log = earlier.log.map(SimDisk::synced_image);
                    "its database and log rolled back to the image of an earlier crash".to_owned()
                }
                None => "nothing (no earlier image to roll back to)".to_owned(),
            },
            DiskDamage::LoseSnapshots => {
                slot.disks.snapshots = SimDisk::default();
                "its snapshot database lost".to_owned()
            }
            DiskDamage::RollBackSnapshots => match &slot.earlier {
                Some(earlier) => {
                    slot.disks.snapshots = earlier.snapshots.synced_image();
                    "its snapshot database rolled back to the image of an earlier crash".to_owned()
                }
                None => "nothing (no earlier image to roll back to)".to_owned(),
            },
        }
    }

    /// Arms a failing sync on one of running node `id`'s disks (its log's
    /// newest segment half the time: the disk it syncs most); says which.
    pub fn fail_next_sync(&mut self, id: NodeId, rng: &mut StdRng) -> String {
        let slot = self.slots.get_mut(&id).expect("known node");
        assert!(slot.running.is_some(), "node {id} is down");
        let newest_segment = slot.disks.log.each().pop();
        let (what, disk) = match newest_segment {
            Some((number, segment)) if rng.gen_bool(0.5) => {
                (format!("its log segment {number}"), segment)
            }
            _ => match rng.gen_range(0..3) {
                0 => ("its database".to_owned(), slot.disks.db.clone()),
                1 => ("its witness".to_owned(), slot.disks.witness.clone()),
                _ => (
                    "its snapshot database".to_owned(),
                    slot.disks.snapshots.clone(),
                ),
            },
        };
        disk.fail_next_sync(rng);
        what
    }

    /// How many syncs of node `id`'s disks failed.
    pub fn failed_syncs(&self, id: NodeId) -> u32 {
        let disks = &self.slots[&id].disks;
        let segments = disks.log.each();
        [&disks.db, &disks.witness, &disks.snapshots]
            .into_iter()
            .chain(segments.iter().map(|(_, segment)| segment))
            .map(SimDisk::failed_syncs)
            .sum()
    }

    /// Why running node `id`'s Raft stopped, if it did: what makes a real
    /// node exit.
    pub fn stopped(&self, id: NodeId) -> Option<String> {
        let running = self.slots[&id].running.as_ref()?;
        let metrics = running.node.raft().metrics().borrow().clone();
        metrics.running_state.err().map(|fatal| fatal.to_string())
    }

    /// A hash of every disk the crashes so far left. Two runs of one seed
    /// write the same bytes, so this tells a run that went its own way on
    /// disk before anything else shows it.
    pub fn crash_digest(&self) -> u64 {
        self.crashed_disks.finish()
    }

    /// The node that currently leads, by the running nodes' own account.
    pub fn leader(&self) -> Option<NodeId> {
        self.slots.iter().find_map(|(&id, slot)| {
            let running = slot.running.as_ref()?;
            let metrics = running.node.raft().metrics().borrow().clone();
            (metrics.current_leader == Some(id)).then_some(id)
        })
    }

    /// Stops every node (the end of a run).
    pub async fn shut_down(&mut self) {
        for slot in self.slots.values_mut() {
            if let Some(running) = slot.running.take() {
                let _ = running.crashed.send(true);
                running.gate.open();
                running.node.crash().await;
            }
        }
    }
}
