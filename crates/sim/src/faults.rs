//! The nemesis of a simulated run: one fault at a time, drawn from the
//! seed, each held for a while and then healed.
//!
//! - a node crashes (the leader half the time) and restarts from its disk,
//!   which lost a random part of what was not synced; now and then with its
//!   clock running fast or slow (rate 0.5x to 2x) from then on;
//! - every node crashes at once, and all restart;
//! - partitions: the leader isolated, one node isolated, a majority and a
//!   minority, or (five nodes) a bridge, where one node sees both halves;
//! - a lossy, slow network: messages lost (5-30 %) and delayed (up to
//!   100 ms), so they also arrive out of order.

use crate::cluster::SimCluster;
use crate::network::LinkQuality;
use deadbolt_server::embedded::NodeId;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::time::Duration;
use tokio::time::Instant;

/// What was done, for the report of a failing seed.
pub type FaultLog = Vec<String>;

fn at() -> String {
    format!("{:>8.3}s", crate::elapsed().as_secs_f64())
}

/// A clock rate: true to a few parts per million, or in a run with clock
/// faults, for a quarter of restarts, anywhere from half to twice real time.
fn clock_rate(rng: &mut StdRng, clock_faults: bool) -> f64 {
    if clock_faults && rng.gen_bool(0.25) {
        rng.gen_range(0.5..=2.0)
    } else {
        1.0 + rng.gen_range(-1e-5..=1e-5)
    }
}

/// A node that cannot start from its own disk after a crash is a finding:
/// the error says why.
async fn restart(
    cluster: &mut SimCluster,
    id: NodeId,
    rng: &mut StdRng,
    log: &mut FaultLog,
) -> Result<(), String> {
    let rate = clock_rate(rng, cluster.clock_faults);
    log.push(format!("{} restart node {id} (clock rate {rate:.3})", at()));
    cluster
        .start(id, rate)
        .await
        .map_err(|err| format!("node {id} could not restart from its disk: {err:#}"))
}

/// Injects faults until `until`; every fault is healed when this returns.
/// Returns how many were injected, or why a node could not restart.
pub async fn inject(
    cluster: &mut SimCluster,
    rng: &mut StdRng,
    until: Instant,
    log: &mut FaultLog,
) -> Result<u64, String> {
    let ids = cluster.ids();
    let mut faults = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(200..1500))).await;
        let hold = Duration::from_millis(rng.gen_range(300..3000));
        let leader = cluster.leader();
        let victim = match leader {
            Some(leader) if rng.gen_bool(0.5) => leader,
            _ => *ids.choose(rng).expect("nodes"),
        };
        faults += 1;
        match rng.gen_range(0..10) {
            0..=3 => {
                log.push(format!("{} crash node {victim} (leader: {leader:?})", at()));
                cluster.crash(victim, rng);
                tokio::time::sleep(hold).await;
                restart(cluster, victim, rng, log).await?;
            }
            4 => {
                log.push(format!("{} crash every node", at()));
                for &id in &ids {
                    cluster.crash(id, rng);
                }
                tokio::time::sleep(hold).await;
                for &id in &ids {
                    restart(cluster, id, rng, log).await?;
                }
            }
            5..=7 => {
                let (side, mut other) = split(&ids, victim, rng);
                if ids.len() == 5 && side.len() == 2 && rng.gen_bool(0.5) {
                    // A bridge: the last node still talks to both sides.
                    let bridge = other.pop().expect("five nodes");
                    log.push(format!("{} node {bridge} bridges:", at()));
                }
                log.push(format!("{} partition {side:?} | {other:?}", at()));
                cluster.fabric.partition(&side, &other);
                tokio::time::sleep(hold).await;
                log.push(format!("{} heal", at()));
                cluster.fabric.heal();
            }
            _ => {
                let quality = LinkQuality {
                    loss: rng.gen_range(0.05..0.3),
                    min_delay: Duration::from_micros(100),
                    max_delay: Duration::from_millis(rng.gen_range(5..100)),
                };
                log.push(format!("{} lossy network {quality:?}", at()));
                cluster.fabric.set_quality(quality);
                tokio::time::sleep(hold).await;
                log.push(format!("{} heal", at()));
                cluster.fabric.heal();
            }
        }
    }
    Ok(faults)
}

/// Splits the nodes for a partition: `victim` alone, or (half the time,
/// with five nodes) `victim` and one more as the minority.
fn split(ids: &[NodeId], victim: NodeId, rng: &mut StdRng) -> (Vec<NodeId>, Vec<NodeId>) {
    let mut others: Vec<NodeId> = ids.iter().copied().filter(|&id| id != victim).collect();
    others.shuffle(rng);
    let mut side = vec![victim];
    if ids.len() == 5 && rng.gen_bool(0.5) {
        side.push(others.pop().expect("five nodes"));
    }
    (side, others)
}
