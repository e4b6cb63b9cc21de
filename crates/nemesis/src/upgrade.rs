//! `deadbolt-nemesis run --upgrade-from PREVIOUS`: a rolling upgrade, and a
//! rollback, as the run's faults (issue 28 §3).
//!
//! Why in the nemesis: the rolling-upgrade test (`crates/cli/tests/
//! rolling_upgrade.rs`) follows one holder and one waiter through the
//! upgrade; here every worker of a fault run locks, writes through its
//! fence and releases throughout, and the same checkers as for random
//! faults read the whole history: no acknowledged grant lost, no token
//! going back, no two holders, and the locks live again once it is over.
//!
//! The plan, as `docs/upgrading.md` tells an operator: the cluster starts
//! on the previous release; each node in turn, followers first and the
//! leader last, is stopped with SIGTERM and started on this build held at
//! the old feature level; one node is rolled back to the previous release
//! and upgraded again; then each node is restarted without the hold,
//! until the cluster version moves to this build's level. A few seconds of
//! load pass between steps, drawn from the run's seed.

use deadbolt_testkit::TestCluster;
use rand::rngs::StdRng;
use rand::Rng;
use std::path::Path;
use std::time::{Duration, Instant};

/// The environment that holds a node of this build at the previous
/// release's feature level (`--max-feature-level 1`).
const HELD_BACK: (&str, &str) = ("DEADBOLT_MAX_FEATURE_LEVEL", "1");
/// How long the cluster version may take to move once every node runs free.
const VERSION_MOVES_WITHIN: Duration = Duration::from_secs(30);

/// Runs the plan on `cluster` (started on `previous`) to `current`,
/// printing each step as a fault; returns the number of steps.
pub async fn upgrade(
    cluster: &mut TestCluster,
    previous: &Path,
    current: &Path,
    rng: &mut StdRng,
    started: Instant,
) -> anyhow::Result<u64> {
    let mut steps = 0u64;
    let mut step = |what: String| {
        steps += 1;
        println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
        steps
    };
    let under_load = |rng: &mut StdRng| Duration::from_millis(rng.gen_range(1000..3000));

    tokio::time::sleep(under_load(rng)).await;
    let leader = cluster.leader_within(Duration::from_secs(30)).await;
    let nodes = cluster.nodes.len() as u64;
    let order: Vec<u64> = (1..=nodes)
        .filter(|id| *id != leader)
        .chain([leader])
        .collect();
    for id in &order {
        cluster.restart_on(*id, current, &[HELD_BACK]).await;
        step(format!("node {id} upgraded, held at the old feature level"));
        tokio::time::sleep(under_load(rng)).await;
    }
    let rolled = order[rng.gen_range(0..order.len())];
    cluster.restart_on(rolled, previous, &[]).await;
    step(format!("node {rolled} rolled back to the previous release"));
    tokio::time::sleep(under_load(rng)).await;
    cluster.restart_on(rolled, current, &[HELD_BACK]).await;
    step(format!("node {rolled} upgraded again"));
    tokio::time::sleep(under_load(rng)).await;
    for id in &order {
        cluster.restart_on(*id, current, &[]).await;
        step(format!("node {id} restarted without the hold"));
        tokio::time::sleep(under_load(rng)).await;
    }

    let newest = feature_level(current)?;
    let deadline = Instant::now() + VERSION_MOVES_WITHIN;
    loop {
        let versions: Vec<Option<u64>> = cluster
            .nodes
            .iter()
            .map(|node| node.status().and_then(|s| s["cluster_version"].as_u64()))
            .collect();
        if versions.iter().all(|v| *v == Some(newest)) {
            return Ok(step(format!("cluster version moved to {newest}")));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the cluster version did not move to {newest} within {VERSION_MOVES_WITHIN:?} \
             of the last restart: {versions:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The feature level the `deadbolt` at `bin` supports.
fn feature_level(bin: &Path) -> anyhow::Result<u64> {
    let out = std::process::Command::new(bin)
        .args(["version", "--json"])
        .output()?;
    let version: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    version["feature_level"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("{} reports no feature level", bin.display()))
}
