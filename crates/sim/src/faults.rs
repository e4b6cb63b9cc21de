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
//!   100 ms), so they also arrive out of order;
//! - a node loses its disk and is replaced as an operator would: `cluster
//!   remove`, restart empty, `cluster add` (learner, catch-up by snapshot,
//!   voter);
//! - a node's disk is damaged while it is down (bits flipped in its
//!   database, the database or its witness lost, the database rolled back to
//!   an older image): it must refuse to start or serve what it held, and a
//!   refused node is rebuilt from its peers as the refusal tells the
//!   operator to;
//! - a node pauses (a GC, a VM stall) for up to three session TTLs: it
//!   sends and handles nothing meanwhile, then handles what waited for it
//!   (`network.rs`);
//! - a sync of one of a node's disks fails, and the disk keeps only part of
//!   what it was asked to write: the node must stop (as a real one exits),
//!   never retry the sync and trust it; it is then restarted from its disk.

use crate::cluster::{DiskDamage, SimCluster};
use crate::network::{address, LinkQuality};
use crate::workload::{now_ns, Failure, History, Router, SESSION_TTL};
use deadbolt_checker::availability::{Bearing, Fault};
use deadbolt_proto::v1::{AddMemberRequest, RemoveMemberRequest};
use deadbolt_proto::ErrorKind;
use deadbolt_server::embedded::{Credentials, NodeId};
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
    router: &mut Router,
    rng: &mut StdRng,
    until: Instant,
    log: &mut FaultLog,
    history: &History,
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
        let (from, first_line) = (now_ns(), log.len());
        // Every fault but two leaves a majority up and connected, which
        // must serve every caller (availability, issue 59).
        let mut bearing = Bearing::Kept;
        match rng.gen_range(0..14) {
            10 => replace(cluster, router, victim, rng, log).await?,
            11 => damage_disk(cluster, router, victim, hold, rng, log).await?,
            12 => fail_a_sync(cluster, victim, hold, rng, log).await?,
            13 => {
                let pause = SESSION_TTL.mul_f64(rng.gen_range(0.2..3.0));
                log.push(format!("{} pause node {victim} for {pause:?}", at()));
                cluster.fabric.pause(victim);
                tokio::time::sleep(pause).await;
                log.push(format!("{} resume node {victim}", at()));
                cluster.fabric.resume(victim);
            }
            0..=3 => {
                log.push(format!("{} crash node {victim} (leader: {leader:?})", at()));
                cluster.crash(victim, rng);
                // A quarter of the time back before anyone else could be
                // elected: openraft restores a leader so as leader of its
                // term, from an older snapshot, with no new entry.
                let hold = match rng.gen_bool(0.25) {
                    true => Duration::from_millis(rng.gen_range(10..120)),
                    false => hold,
                };
                tokio::time::sleep(hold).await;
                restart(cluster, victim, rng, log).await?;
            }
            4 => {
                bearing = Bearing::NoMajority {
                    grace: RESTART_GRACE.as_nanos() as u64,
                };
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
                // Messages between the nodes lost and late: no majority is
                // reliably connected until the network heals.
                bearing = Bearing::NoMajority {
                    grace: RESTART_GRACE.as_nanos() as u64,
                };
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
        history.fault(Fault {
            from,
            to: now_ns(),
            what: log.get(first_line).cloned().unwrap_or_default(),
            bearing,
        });
    }
    Ok(faults)
}

/// After a fault that left no majority, how long until a leader serves
/// again: the nodes restart (or the network heals), elect, and catch up.
const RESTART_GRACE: Duration = Duration::from_secs(5);

/// Node `lost` loses its disk and is rebuilt from its peers.
async fn replace(
    cluster: &mut SimCluster,
    router: &mut Router,
    lost: NodeId,
    rng: &mut StdRng,
    log: &mut FaultLog,
) -> Result<(), String> {
    log.push(format!("{} node {lost} loses its disk", at()));
    cluster.crash(lost, rng);
    rebuild(cluster, router, lost, rng, log).await
}

/// Node `victim` crashes and its disk is damaged while it is down. It must
/// refuse to start where the damage is certain to matter; a node that
/// refuses is rebuilt from its peers.
async fn damage_disk(
    cluster: &mut SimCluster,
    router: &mut Router,
    victim: NodeId,
    hold: Duration,
    rng: &mut StdRng,
    log: &mut FaultLog,
) -> Result<(), String> {
    let damage = *[
        DiskDamage::FlipBits,
        DiskDamage::LoseDatabase,
        DiskDamage::LoseWitness,
        DiskDamage::RollBack,
        DiskDamage::LoseSnapshots,
        DiskDamage::RollBackSnapshots,
    ]
    .choose(rng)
    .expect("kinds of damage");
    cluster.crash(victim, rng);
    let what = cluster.damage(victim, damage, rng);
    log.push(format!("{} crash node {victim}, then {what}", at()));
    tokio::time::sleep(hold).await;
    match restart(cluster, victim, rng, log).await {
        Ok(()) if damage.must_refuse() => Err(format!(
            "node {victim} started on a disk with {what}: it must refuse"
        )),
        Ok(()) => Ok(()),
        Err(refusal) => {
            log.push(format!("{} refused: {refusal}", at()));
            rebuild(cluster, router, victim, rng, log).await
        }
    }
}

/// How long a node may go on after a sync of its disks failed: its Raft
/// stops at the storage error, within the write that met it.
const STOP_AFTER_FAILED_SYNC: Duration = Duration::from_secs(2);

/// One sync of node `victim`'s disks fails. The node must stop without
/// syncing again (a crash of a node that went on would show the writes the
/// failed sync lost); it is then restarted from its disk, as an operator
/// would once the disk is checked.
async fn fail_a_sync(
    cluster: &mut SimCluster,
    victim: NodeId,
    hold: Duration,
    rng: &mut StdRng,
    log: &mut FaultLog,
) -> Result<(), String> {
    let failed_before = cluster.failed_syncs(victim);
    let what = cluster.fail_next_sync(victim, rng);
    log.push(format!(
        "{} node {victim}: the next sync of {what} fails",
        at()
    ));
    let give_up = Instant::now() + hold;
    while cluster.failed_syncs(victim) == failed_before {
        if Instant::now() >= give_up {
            // Nothing synced that disk meanwhile; the armed failure waits
            // for its next sync, which the crash below makes moot.
            log.push(format!("{} no sync of {what} came", at()));
            cluster.crash(victim, rng);
            return restart(cluster, victim, rng, log).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let failed_at = Instant::now();
    let stopped = loop {
        if let Some(why) = cluster.stopped(victim) {
            break why;
        }
        if failed_at.elapsed() > STOP_AFTER_FAILED_SYNC {
            return Err(format!(
                "node {victim} still runs {STOP_AFTER_FAILED_SYNC:?} after a sync of {what} failed"
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    log.push(format!("{} node {victim} stopped: {stopped}", at()));
    cluster.crash(victim, rng);
    tokio::time::sleep(hold).await;
    restart(cluster, victim, rng, log).await
}

/// Node `lost`, down with its data gone or refused, comes back as a new
/// member: removed from the cluster, restarted empty, added again. No other
/// fault runs meanwhile, so both changes must go through.
async fn rebuild(
    cluster: &mut SimCluster,
    router: &mut Router,
    lost: NodeId,
    rng: &mut StdRng,
    log: &mut FaultLog,
) -> Result<(), String> {
    log.push(format!(
        "{} rebuild node {lost}: remove, restart empty, add",
        at()
    ));
    cluster.wipe(lost);
    membership_change(router, "remove", lost, |api, credentials| async move {
        let request = RemoveMemberRequest { node_id: lost };
        api.remove_member(&credentials, request).await
    })
    .await?;
    restart(cluster, lost, rng, log).await?;
    membership_change(router, "add", lost, |api, credentials| async move {
        let request = AddMemberRequest {
            node_id: lost,
            address: address(lost),
        };
        api.add_member(&credentials, request).await
    })
    .await?;
    log.push(format!("{} node {lost} is a voter again", at()));
    Ok(())
}

/// Sends a membership change until the leader takes it: a healthy cluster
/// must, within a minute.
async fn membership_change<T, Fut>(
    router: &mut Router,
    what: &str,
    node: NodeId,
    change: impl Fn(deadbolt_server::embedded::Api, std::sync::Arc<Credentials>) -> Fut,
) -> Result<(), String>
where
    Fut: std::future::Future<Output = Result<T, deadbolt_server::embedded::ApiError>>,
{
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        let failure = match router.send(&change).await {
            Ok(_) => return Ok(()),
            // Already done by an attempt whose answer was lost.
            Err(Failure::Refused(err))
                if err.kind == ErrorKind::InvalidArgument
                    && err.message.contains("not a member") =>
            {
                return Ok(())
            }
            Err(failure) => failure,
        };
        if Instant::now() >= give_up {
            return Err(format!(
                "a healthy cluster did not {what} node {node} within a minute: {failure:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
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
