//! The cluster version, as an operator meets it in a rolling upgrade.
//!
//! Why real processes: the version moves because a leader asks its members
//! over the network what they support (`server/src/cluster_version.rs`),
//! and "never back" is a node refusing to start. A node started with
//! `--max-feature-level 1` stands in for a node of release 0.1.0, which
//! supports level 1 only (it behaves as that release would: it applies
//! nothing above level 1).

mod common;

use common::{http, run, run_while_unreachable, TestCluster, BIN};
use deadbolt_server::{FeatureLevel, CLUSTER_VERSION_ASK_EVERY};
use std::path::Path;
use std::time::{Duration, Instant};

const HELD_BACK: (&str, &str) = ("DEADBOLT_MAX_FEATURE_LEVEL", "1");

/// Each node's cluster version, as it reports it (`None`: not answering).
async fn versions(cluster: &TestCluster) -> Vec<Option<u32>> {
    let mut versions = Vec::new();
    for node in &cluster.nodes {
        let status = deadbolt_client::Client::connect([node.endpoint()])
            .await
            .ok();
        let version = match status {
            Some(client) => client
                .cluster_status()
                .await
                .ok()
                .map(|s| s.cluster_version),
            None => None,
        };
        versions.push(version.map(|v| FeatureLevel::reported(v).0));
    }
    versions
}

/// Node 1's `deadbolt_cluster_version` line in `/metrics`.
fn metric_on_node_1(cluster: &TestCluster) -> String {
    let (_, text) = http(cluster.node(1).listen, "GET", "/metrics", None).unwrap();
    let line = text
        .lines()
        .find(|line| line.starts_with("deadbolt_cluster_version "));
    line.unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_version_moves_once_every_member_supports_it_and_never_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = TestCluster::stopped(Path::new(BIN), dir.path(), 3, None).await;
    cluster.start_node(1);
    cluster.start_node(2);
    cluster.start_node_with_env(3, &[HELD_BACK]);
    cluster.leader_within(Duration::from_secs(30)).await;
    let endpoint = cluster.endpoints().join(",");
    let client = cluster.client().await;
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let held = session.lock("upgrade/held").await.unwrap();

    // Several rounds of asking pass; node 3 holds the version at 1.
    tokio::time::sleep(CLUSTER_VERSION_ASK_EVERY * 3).await;
    assert_eq!(versions(&cluster).await, [Some(1); 3]);
    assert_eq!(metric_on_node_1(&cluster), "deadbolt_cluster_version 1");
    let status = run(&endpoint, &["cluster", "status"]).await;
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("cluster version: 1")
            && text.contains("feature level 1)")
            && text.contains(&format!("feature level {})", FeatureLevel::NEWEST)),
        "{text}"
    );

    // Node 3 upgraded (restarted without the flag): the version moves on
    // every node, and the lock is still held, with its token.
    cluster.terminate(3);
    cluster.start_node(3);
    let newest = Some(FeatureLevel::NEWEST.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while versions(&cluster).await != [newest; 3] {
        assert!(Instant::now() < deadline, "{:?}", versions(&cluster).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        metric_on_node_1(&cluster),
        format!("deadbolt_cluster_version {}", FeatureLevel::NEWEST)
    );
    let locks = client.list_locks().await.unwrap();
    let listed = locks.iter().find(|lock| lock.lock == "upgrade/held");
    assert_eq!(
        listed.map(|lock| lock.token),
        Some(held.token()),
        "{locks:?}"
    );

    // Never back: node 3 held back again stops, and says why.
    cluster.terminate(3);
    cluster.start_node_with_env(3, &[HELD_BACK]);
    let exit = cluster.exit_within(3, Duration::from_secs(30)).await;
    assert!(!exit.success());
    let log = cluster.node(3).log_text();
    assert!(
        log.contains("above the feature level 1 this node supports"),
        "{log}"
    );

    // Nor is a node held back taken in: removed, and back with --join.
    // Asked of the two live nodes only: a CI run's CLI reported node 3's
    // reset connection, three times, while an election was under way.
    let endpoint = format!(
        "{},{}",
        cluster.node(1).endpoint(),
        cluster.node(2).endpoint()
    );
    let removed = run_while_unreachable(&endpoint, &["cluster", "remove", "3"]).await;
    assert!(removed.status.success(), "{removed:?}");
    let data = cluster.node(3).data_dir.clone();
    std::fs::rename(&data, data.with_extension("old")).unwrap();
    cluster.spawn_node(3, &["--join", "--max-feature-level", "1"]);
    let address = cluster.node(3).advertised.to_string();
    let added = run_while_unreachable(&endpoint, &["cluster", "add", "3", &address]).await;
    let said = String::from_utf8_lossy(&added.stderr);
    assert_eq!(added.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "supports feature level 1, below the cluster version {}",
            FeatureLevel::NEWEST
        )),
        "{said}"
    );
    // A node that does not answer is not listed either: its release is
    // unknown (port 1 on loopback: nothing listens there).
    let added = run_while_unreachable(&endpoint, &["cluster", "add", "5", "127.0.0.1:1"]).await;
    let said = String::from_utf8_lossy(&added.stderr);
    assert!(!added.status.success(), "{said}");
    assert!(
        said.contains("node 5 did not answer") && said.contains("release is unknown"),
        "{said}"
    );
    let status = client.cluster_status().await.unwrap();
    assert_eq!(status.members.len(), 2, "{status:?}");
    drop(held);
}
