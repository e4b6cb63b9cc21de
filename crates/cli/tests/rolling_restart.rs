//! A rolling restart of every node, as a configuration change or an
//! upgrade does it (issue 28 §4): one node at a time, SIGTERM, start again,
//! wait for it to rejoin, the leader last. Under `deadbolt bench` and a set
//! of `deadbolt run` holders, none of them may notice: the bench ends
//! without an error and its tokens only grow, every holder's command runs
//! to its end (a lost lock would have killed it: exit 76), and the worst
//! acquire latency is printed, for the closing note.
//!
//! Why a test of its own: every other failover test kills a node. A
//! planned restart goes through the graceful path instead: a leader hands
//! leadership to an up-to-date follower (`handover.rs`), then calls in
//! flight are answered, streams ended, the listener closed.

mod common;

use common::{start_cluster, BIN};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// How long the bench measures; the restarts fit well inside it.
const BENCH: Duration = Duration::from_secs(15);
/// How long each holder's command runs: past the bench, so that every
/// restart happens while the holders hold.
const HOLD: Duration = Duration::from_secs(18);

fn spawn(endpoints: &str, args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env("DEADBOLT_ENDPOINT", endpoints)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start deadbolt")
}

async fn finished(child: Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_goes_unnoticed_by_the_bench_and_the_holders() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(dir.path(), 3).await;
    let endpoints = cluster.endpoints().join(",");
    let hold = HOLD.as_secs().to_string();
    let holders: Vec<Child> = (0..3)
        .map(|i| {
            let lock = format!("cron-{i}");
            spawn(
                &endpoints,
                &["run", "--lock", &lock, "--ttl", "10s", "--", "sleep", &hold],
            )
        })
        .collect();
    let duration = format!("{}s", BENCH.as_secs());
    let bench = spawn(
        &endpoints,
        &[
            "bench",
            "uncontended",
            "--clients",
            "8",
            "--duration",
            &duration,
        ],
    );
    // The bench's warm-up, and the holders' grants.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let leader = cluster.leader_within(Duration::from_secs(30)).await;
    let followers = (1..=3).filter(|id| *id != leader);
    for id in followers.chain([leader]) {
        let stopped = cluster.terminate_within(id, Duration::from_secs(20)).await;
        assert!(stopped.success(), "node {id} stopped with {stopped:?}");
        cluster.start_node(id);
        // Every running node, the restarted one included, agrees on a
        // leader that has applied everything before it leads.
        cluster.leader_within(Duration::from_secs(30)).await;
    }

    let bench = finished(bench).await;
    let said = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success(),
        "the bench failed: {said}\n{}\n{}",
        String::from_utf8_lossy(&bench.stderr),
        cluster.logs()
    );
    assert!(
        said.contains("tokens strictly increasing per client: yes"),
        "{said}"
    );
    let latency = said
        .lines()
        .find(|line| line.contains("acquire latency"))
        .unwrap_or_else(|| panic!("{said}"));
    println!("through a rolling restart of 3 nodes: {}", latency.trim());
    for (i, holder) in holders.into_iter().enumerate() {
        let held = finished(holder).await;
        assert!(
            held.status.success(),
            "holder {i} did not run to its end: {:?}\n{}",
            held.status,
            String::from_utf8_lossy(&held.stderr)
        );
    }
}

/// A leader stopped with SIGTERM names the follower it handed leadership
/// to, and that follower leads: the cluster did not wait for an election
/// timeout (`bench failover` measures how long it takes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_leadership_to_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(dir.path(), 3).await;
    let leader = cluster.leader_within(Duration::from_secs(30)).await;
    // openraft's vote rules let a leader vote for another only once it has
    // led for longer than its lease (300 ms by default).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped = cluster
        .terminate_within(leader, Duration::from_secs(20))
        .await;
    assert!(stopped.success(), "node {leader} stopped with {stopped:?}");
    let said = cluster.node(leader).log_text();
    let handed_to: u64 = said
        .lines()
        .find_map(|line| line.split("handed leadership over leader=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("node {leader} did not hand leadership over:\n{said}"));
    assert_ne!(handed_to, leader);
    let candidate_said = cluster.node(handed_to).log_text();
    assert!(
        candidate_said.contains("standing for election at the leader's request"),
        "node {handed_to} did not say it was asked to stand:\n{candidate_said}"
    );
    let now_leading = cluster.leader_within(Duration::from_secs(30)).await;
    assert_eq!(now_leading, handed_to, "{}", cluster.logs());
}
