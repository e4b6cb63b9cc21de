//! A rolling upgrade from the previous release to this build, and a
//! rollback, with real processes of both releases (issue 28, section 3).
//!
//! Why ignored: it needs the previous release's binary, which
//! `scripts/previous-release.sh` builds from its pinned commit (a second
//! build of the workspace, 6-8 minutes of CI's two cores). Run it with
//! `scripts/upgrade-check.sh`, next to the nemesis's upgrade run, or alone with
//!
//! ```sh
//! DEADBOLT_PREVIOUS_BIN=$(scripts/previous-release.sh) \
//!     cargo test -p deadbolt-cli --test rolling_upgrade -- --ignored
//! ```
//!
//! A 3-node cluster of the previous release, with a lock held and a
//! blocking acquire queued behind it (by this build's client: new client,
//! old servers), is upgraded one node at a time, the leader last, each
//! upgraded node held at the old feature level; one node is rolled back
//! and upgraded again; then the flag is dropped node by node and the
//! cluster version moves. Throughout: the holder keeps its lock and
//! token, the waiter keeps its place, and tokens only grow. At the end the
//! previous release's CLI reads the current servers.

mod common;

use common::TestCluster;
use deadbolt_server::FeatureLevel;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CURRENT: &str = env!("CARGO_BIN_EXE_deadbolt");
const HELD_BACK: (&str, &str) = ("DEADBOLT_MAX_FEATURE_LEVEL", "1");

fn previous_bin() -> PathBuf {
    let bin = std::env::var_os("DEADBOLT_PREVIOUS_BIN").expect(
        "DEADBOLT_PREVIOUS_BIN: the previous release's deadbolt (scripts/previous-release.sh)",
    );
    PathBuf::from(bin)
}

/// Every node's release and cluster version (a node of the previous
/// release reports no cluster version: level 1).
async fn versions(cluster: &TestCluster) -> Vec<(String, u32)> {
    let mut versions = Vec::new();
    for node in &cluster.nodes {
        let client = deadbolt_client::Client::connect([node.endpoint()])
            .await
            .unwrap();
        let status = client.cluster_status().await.unwrap();
        let release = status.versions.map(|v| v.release).unwrap_or_default();
        versions.push((release, FeatureLevel::reported(status.cluster_version).0));
    }
    versions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs DEADBOLT_PREVIOUS_BIN; see the module comment"]
async fn a_cluster_of_the_previous_release_upgrades_one_node_at_a_time() {
    let previous = previous_bin();
    let current = Path::new(CURRENT);
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = TestCluster::start(&previous, dir.path(), 3).await;
    let old_release = versions(&cluster).await[0].0.clone();
    assert_eq!(old_release, "0.1.0");
    let old_cluster = vec![(old_release.clone(), 1); 3];
    assert_eq!(versions(&cluster).await, old_cluster);
    let client = cluster.client().await;
    let holder = client.open_session(Duration::from_secs(10)).await.unwrap();
    let held = holder.lock("upgrade/held").await.unwrap();
    let waiter = client.open_session(Duration::from_secs(10)).await.unwrap();
    let queued = tokio::spawn(async move {
        let guard = waiter.lock("upgrade/held").await;
        (waiter, guard)
    });
    let mut highest = held.token();
    let take_one = || {
        let client = client.clone();
        async move {
            let session = client.open_session(Duration::from_secs(10)).await.unwrap();
            let guard = session.lock("upgrade/other").await.unwrap();
            let token = guard.token();
            guard.release().await.unwrap();
            session.close().await.unwrap();
            token
        }
    };

    // Followers first, the leader last, each held at the old level.
    let leader = cluster.leader_within(Duration::from_secs(30)).await;
    let order: Vec<u64> = (1..=3).filter(|id| *id != leader).chain([leader]).collect();
    for id in &order {
        cluster.restart_on(*id, current, &[HELD_BACK]).await;
        let token = take_one().await;
        assert!(token > highest, "token {token} after {highest}");
        highest = token;
    }
    let release = deadbolt_server::version::RELEASE.to_owned();
    assert_eq!(versions(&cluster).await, vec![(release.clone(), 1); 3]);

    // One node rolled back to the previous release, and upgraded again.
    let rolled = order[0];
    cluster.restart_on(rolled, &previous, &[]).await;
    let token = take_one().await;
    assert!(token > highest, "token {token} after {highest}");
    highest = token;
    cluster.restart_on(rolled, current, &[]).await;

    // The flag dropped node by node: the version moves once all run free.
    for id in &order[1..] {
        cluster.restart_on(*id, current, &[]).await;
    }
    let upgraded = vec![(release, FeatureLevel::NEWEST.0); 3];
    let deadline = Instant::now() + Duration::from_secs(30);
    while versions(&cluster).await != upgraded {
        assert!(Instant::now() < deadline, "{:?}", versions(&cluster).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The holder kept its lock (only the holder may release it), and the
    // waiter gets it next, with a larger token than any before.
    assert!(!queued.is_finished(), "the waiter was answered early");
    held.release().await.unwrap();
    let (_waiter, granted) = queued.await.unwrap();
    let granted = granted.unwrap();
    assert!(
        granted.token() > highest,
        "{} after {highest}",
        granted.token()
    );

    // The previous release's CLI reads the current servers, a read/write
    // lock (a feature of the new level) included: as a lock held by its
    // first holder.
    let reader = client.open_session(Duration::from_secs(10)).await.unwrap();
    let _shared = reader.read_lock("upgrade/rw").await.unwrap();
    let endpoint = cluster.endpoints().join(",");
    let listed = Command::new(&previous)
        .args(["locks"])
        .env("DEADBOLT_ENDPOINT", &endpoint)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && text.contains("upgrade/held") && text.contains("upgrade/rw"),
        "{listed:?}"
    );
    let status = Command::new(&previous)
        .args(["cluster", "status"])
        .env("DEADBOLT_ENDPOINT", &endpoint)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
}
