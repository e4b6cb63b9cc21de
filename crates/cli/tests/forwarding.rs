//! Any node serves any client: a follower forwards what needs the leader
//! (`server/src/forward.rs`), as the caller, so that clients given one
//! address (a follower's, or a load balancer's) work as if given the
//! leader's.
//!
//! Why these tests: behind a load balancer two calls in three land on a
//! follower, and before forwarding they were refused with `not_leader` and
//! a leader address the client may not reach. The identity is the part
//! that must not slip: a forwarded call reaches the leader over the
//! follower's own connection, with the follower's node certificate, and
//! must still run as the caller; and nobody but a node may claim to
//! forward.

mod common;

use common::{as_token, curl_at, stdout, TestCluster, BIN};
use deadbolt_client::Client;
use deadbolt_testkit::TestPki;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tests run one at a time: two TLS clusters at once (and a load
/// balancer) starve a two-core machine into elections.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A TLS cluster of three whose client certificate names `alice`, once
/// its cluster version lets followers forward.
async fn tls_cluster(dir: &Path) -> TestCluster {
    tls_cluster_with(dir, &[]).await
}

/// [`tls_cluster`], each node started with `flags`.
async fn tls_cluster_with(dir: &Path, flags: &[&str]) -> TestCluster {
    let pki = TestPki::create(Path::new(BIN), &dir.join("certs"), "alice");
    let mut cluster =
        TestCluster::stopped(Path::new(BIN), &dir.join("cluster"), 3, Some(pki)).await;
    for id in 1..=3 {
        cluster.start_node_with_flags(id, flags);
    }
    cluster.leader_within(Duration::from_secs(30)).await;
    let newest = deadbolt_server::FeatureLevel::NEWEST.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster_version(&cluster) < newest {
        assert!(Instant::now() < deadline, "{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster
}

/// The cluster version every running node has applied (the lowest).
fn cluster_version(cluster: &TestCluster) -> u32 {
    cluster
        .nodes
        .iter()
        .filter(|node| node.is_running())
        .map(|node| {
            let status = node.status().unwrap_or_default();
            status["cluster_version"].as_u64().unwrap_or(0) as u32
        })
        .min()
        .unwrap_or(0)
}

/// `deadbolt ARGS...` at `endpoint` with the cluster's client certificate,
/// and a token when given.
fn cli(cluster: &TestCluster, endpoint: &str, token: Option<&str>, args: &[&str]) -> Output {
    let flags = cluster.pki().unwrap().client_flags();
    let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
    all.extend(args);
    as_token(endpoint, token, &all)
}

/// [`cli`] of a read with `--json`, which must succeed: its answer. Run
/// again while it exits 69 (EX_UNAVAILABLE: try again), at most three
/// times, as an operator would: an election that outlasts the client's
/// leader search (two cores shared with other tests can starve a heartbeat)
/// leaves the follower knowing no leader to forward to. A CI run's history
/// read ended so (stop 42).
fn cli_json(cluster: &TestCluster, endpoint: &str, token: Option<&str>, args: &[&str]) -> Value {
    let mut attempts = 1;
    let output = loop {
        let output = cli(cluster, endpoint, token, args);
        if output.status.code() != Some(69) || attempts == 3 {
            break output;
        }
        attempts += 1;
        std::thread::sleep(Duration::from_secs(1));
    };
    serde_json::from_str(&stdout(&output)).unwrap()
}

/// `curl` over TLS with the cluster's client certificate (the server asks
/// every client for one), a token and extra headers when given: the HTTP
/// status and the JSON reply.
fn curl(
    cluster: &TestCluster,
    addr: SocketAddr,
    token: Option<&str>,
    headers: &[&str],
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let flags = cluster.pki().unwrap().client_flags();
    let file = |flag: &str| {
        let at = flags.iter().position(|f| f == flag).unwrap();
        flags[at + 1].clone()
    };
    let mut options = vec!["--cacert".to_owned(), file("--ca")];
    options.extend([
        "--cert".to_owned(),
        file("--cert"),
        "--key".to_owned(),
        file("--key"),
    ]);
    for header in headers {
        options.extend(["-H".to_owned(), header.to_string()]);
    }
    curl_at(&format!("https://{addr}{path}"), &options, token, body)
}

/// Turns access control on at `endpoint`: a role `jobs` (lock and read
/// under `jobs/`) for `alice` (her certificate) and `worker` (a token).
/// Returns (root, worker) tokens.
fn secure(cluster: &TestCluster, endpoint: &str) -> (String, String) {
    let root = stdout(&cli(cluster, endpoint, None, &["acl", "bootstrap"]));
    let admin = |args: &[&str]| stdout(&cli(cluster, endpoint, Some(&root), args));
    admin(&["acl", "role", "put", "jobs", "lock:jobs/", "read:jobs/"]);
    admin(&["acl", "grant", "alice", "jobs"]);
    admin(&["acl", "grant", "worker", "jobs"]);
    let worker = admin(&["acl", "token", "create", "worker"]);
    (root, worker)
}

/// `deadbolt_forwarded_calls_total{result="answered"}` on the node at
/// `addr`.
fn forwarded_answered(cluster: &TestCluster, addr: SocketAddr, root: &str) -> u64 {
    let (status, scrape) = curl(cluster, addr, Some(root), &[], "/metrics", None);
    assert_eq!(status, 200);
    let scrape = scrape.as_str().unwrap().to_owned();
    scrape
        .lines()
        .find(|line| line.starts_with(r#"deadbolt_forwarded_calls_total{result="answered"}"#))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no forwarded-calls series:\n{scrape}")) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_serves_every_client_as_the_leader_would_and_as_the_caller() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = tls_cluster(dir.path()).await;
    let leader = cluster.leader_within(Duration::from_secs(30)).await;
    let follower = cluster.nodes.iter().find(|n| n.id != leader).unwrap();
    let (at_follower, follower_addr) = (follower.endpoint(), follower.listen);
    let leader_addr = cluster.node(leader).listen;
    let (root, worker) = secure(&cluster, &at_follower);

    // The identity is the caller's, not the forwarding node's certificate
    // ("node"): alice by her certificate, worker by its token.
    let whoami = |token: Option<&str>| {
        let (status, me) = curl(&cluster, follower_addr, token, &[], "/v1/acl/whoami", None);
        assert_eq!(status, 200, "{me}");
        (me["identity"].clone(), me["authenticated_by"].clone())
    };
    assert_eq!(whoami(None), (json!("alice"), json!("certificate")));
    assert_eq!(whoami(Some(&worker)), (json!("worker"), json!("token")));

    // Writes a follower used to refuse with `not_leader` are done, and
    // access control decides as the leader would.
    let (status, opened) = curl(
        &cluster,
        follower_addr,
        Some(&worker),
        &[],
        "/v1/session/open",
        Some(&json!({"ttl_ms": 30_000})),
    );
    assert_eq!(status, 200, "{opened}");
    let acquired = cli(
        &cluster,
        &at_follower,
        None,
        &["acquire", "--lock", "jobs/a"],
    );
    assert!(acquired.status.success(), "{acquired:?}");
    let refused = cli(
        &cluster,
        &at_follower,
        None,
        &["acquire", "--lock", "web/a"],
    );
    assert_eq!(refused.status.code(), Some(77), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains(r#"identity "alice""#), "{said}");

    // The Rust client given only the follower.
    let tls = cluster.pki().unwrap().tls_options();
    let before = forwarded_answered(&cluster, follower_addr, &root);
    let client = Client::connect_with_token([at_follower.clone()], &tls, Some(&worker))
        .await
        .unwrap();
    let session = client.open_session(Duration::from_secs(10)).await.unwrap();
    let mut last = 0;
    for _ in 0..5 {
        let guard = session.lock("jobs/b").await.unwrap();
        assert!(guard.token() > last);
        last = guard.token();
        guard.release().await.unwrap();
    }
    let history = cli_json(
        &cluster,
        &at_follower,
        Some(&root),
        &["history", "--lock", "jobs/b", "--json"],
    );
    let identities: Vec<&str> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["identity"].as_str().unwrap())
        .collect();
    assert_eq!(identities.len(), 10, "{history}");
    assert!(identities.iter().all(|who| *who == "worker"), "{history}");
    session.close().await.unwrap();
    // Opening its session went through the follower, whose answer named the
    // leader: the client sent the rest there itself, a hop shorter.
    let after = forwarded_answered(&cluster, follower_addr, &root);
    assert!(
        after > before && after - before <= 2,
        "forwarded {before} then {after}"
    );

    // Nobody but a node may claim to forward: alice's certificate with the
    // headers a follower adds is refused, at the leader and anywhere else.
    for addr in [leader_addr, follower_addr] {
        let (status, reply) = curl(
            &cluster,
            addr,
            None,
            &[
                "deadbolt-forwarded-by: 2",
                "deadbolt-forwarded-certificate: root",
            ],
            "/v1/acl/whoami",
            None,
        );
        assert_eq!(status, 403, "{reply}");
        assert_eq!(reply["error"]["kind"], "permission_denied", "{reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("only the cluster's nodes may forward"),
            "{message}"
        );
    }
}

/// Issue 58: a caller's limit of calls in flight
/// (`--max-calls-per-identity`) must hold wherever its calls enter, not
/// once per node it sends them through. Two blocking acquires of `worker`
/// wait through two different followers; a third call of `worker`, through
/// either follower or the leader, is refused as the limit says, while
/// another identity goes on. (It holds because the leader counts each
/// forwarded call under the caller's identity: the follower only passes
/// it on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identitys_call_limit_holds_through_every_follower() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = tls_cluster_with(dir.path(), &["--max-calls-per-identity", "2"]).await;
    let leader = cluster.leader_within(Duration::from_secs(30)).await;
    let followers: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.id != leader)
        .map(|node| node.endpoint())
        .collect();
    let at_leader = cluster.node(leader).endpoint();
    let (root, worker) = secure(&cluster, &followers[0]);
    let held = cli(
        &cluster,
        &at_leader,
        Some(&root),
        &["acquire", "--lock", "jobs/a"],
    );
    assert!(held.status.success(), "{held:?}");

    let flags = cluster.pki().unwrap().client_flags();
    let waiters: Vec<_> = followers
        .iter()
        .map(|follower| {
            std::process::Command::new(BIN)
                .args(&flags)
                .args(["acquire", "--lock", "jobs/a", "--wait", "60s"])
                .env("DEADBOLT_ENDPOINT", follower)
                .env("DEADBOLT_ACCESS_TOKEN", &worker)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    loop {
        let status = cli_json(
            &cluster,
            &at_leader,
            Some(&root),
            &["status", "--lock", "jobs/a", "--json"],
        );
        if status["state"]["waiter_session_ids"]
            .as_array()
            .unwrap()
            .len()
            == 2
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for entry in [&followers[0], &followers[1], &at_leader] {
        let third = cli(
            &cluster,
            entry,
            Some(&worker),
            &["acquire", "--lock", "jobs/b"],
        );
        let said = String::from_utf8_lossy(&third.stderr);
        assert_eq!(third.status.code(), Some(1), "through {entry}: {third:?}");
        assert!(
            said.contains(r#"identity "worker" has 2 calls in flight already"#),
            "through {entry}: {said}"
        );
    }
    // Another identity (alice, by her certificate) is not held up.
    let other = cli(
        &cluster,
        &followers[1],
        None,
        &["acquire", "--lock", "jobs/c"],
    );
    assert!(other.status.success(), "{other:?}");
    for mut waiter in waiters {
        waiter.kill().unwrap();
        waiter.wait().unwrap();
    }
}

/// Grants the worker must get after the leader's death.
const AFTER_KILL: usize = 10;

/// The issue's test: a round-robin TCP load balancer in front of the three
/// nodes (haproxy, passing TLS through), and clients given its address
/// only. The leader is killed while a session holds one lock and a worker
/// takes and gives back another: the holder keeps its lock, the worker's
/// tokens keep growing under the new leader, and the CLI and curl work
/// through the balancer whichever node it picks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_load_balancer_clients_keep_working_while_the_leader_dies() {
    let _serial = ONE_CLUSTER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = tls_cluster(dir.path()).await;
    let nodes: Vec<SocketAddr> = cluster.nodes.iter().map(|node| node.listen).collect();
    let Some(balancer) = deadbolt_testkit::peers::haproxy(&nodes) else {
        return;
    };
    let balancer_addr: SocketAddr = balancer.address().parse().unwrap();
    let at_balancer = format!("https://{balancer_addr}");
    let (root, worker) = secure(&cluster, &at_balancer);

    let tls = cluster.pki().unwrap().tls_options();
    let client = Client::connect_with_token([at_balancer.clone()], &tls, Some(&worker))
        .await
        .unwrap();
    let session = client.open_session(Duration::from_secs(10)).await.unwrap();
    let held = session.lock("jobs/held").await.unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let granted = Arc::new(AtomicUsize::new(0));
    let busy = tokio::spawn({
        let (session, granted) = (session.clone(), granted.clone());
        async move {
            let (mut grants, mut errors) = (Vec::new(), Vec::new());
            while !*stopped.borrow() {
                match session.lock("jobs/busy").await {
                    Ok(guard) => {
                        grants.push((Instant::now(), guard.token()));
                        granted.fetch_add(1, Ordering::Relaxed);
                        if let Err(err) = guard.release().await {
                            errors.push(format!("release: {err}"));
                        }
                    }
                    Err(err) => errors.push(format!("acquire: {err}")),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (grants, errors)
        }
    });

    tokio::time::sleep(Duration::from_secs(1)).await;
    let leader = cluster.leader_within(Duration::from_secs(30)).await;
    cluster.kill9(leader);
    let (killed, before_kill) = (Instant::now(), granted.load(Ordering::Relaxed));
    let new_leader = cluster.leader_within(Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);
    // The worker goes on under the new leader, through any node.
    while granted.load(Ordering::Relaxed) < before_kill + AFTER_KILL
        && killed.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    let (grants, errors) = busy.await.unwrap();

    assert!(errors.is_empty(), "surfaced to the worker: {errors:?}");
    let tokens: Vec<u64> = grants.iter().map(|(_, token)| *token).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let after_kill = grants.iter().filter(|(at, _)| *at > killed).count();
    assert!(
        after_kill >= AFTER_KILL,
        "{after_kill} grants after the kill"
    );
    assert!(!session.is_lost(), "the holder's lease was lost");

    // The CLI and curl, through whichever node the balancer picks.
    for _ in 0..3 {
        let status = cli_json(
            &cluster,
            &at_balancer,
            Some(&worker),
            &["status", "--lock", "jobs/held", "--json"],
        );
        assert_eq!(status["state"]["token"], json!(held.token()), "{status}");
        let (code, reply) = curl(
            &cluster,
            balancer_addr,
            Some(&worker),
            &[],
            "/v1/lock/status?lock=jobs/held",
            None,
        );
        assert_eq!(code, 200, "{reply}");
        assert_eq!(reply["state"]["token"], json!(held.token()), "{reply}");
    }
    let acquired = cli(
        &cluster,
        &at_balancer,
        Some(&worker),
        &["acquire", "--lock", "jobs/cli"],
    );
    assert!(acquired.status.success(), "{acquired:?}");
    held.release().await.unwrap();
    session.close().await.unwrap();
    drop(root);
}
