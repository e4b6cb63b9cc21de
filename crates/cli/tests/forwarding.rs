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

use common::{TestCluster, BIN};
use deadbolt_client::Client;
use deadbolt_testkit::TestPki;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A TLS cluster of three whose client certificate names `alice`, once
/// its cluster version lets followers forward.
async fn tls_cluster(dir: &Path) -> TestCluster {
    let pki = TestPki::create(Path::new(BIN), &dir.join("certs"), "alice");
    let cluster = TestCluster::start_with(Path::new(BIN), &dir.join("cluster"), 3, Some(pki)).await;
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
    let mut command = Command::new(BIN);
    command
        .args(cluster.pki().unwrap().client_flags())
        .args(args)
        .env("DEADBOLT_ENDPOINT", endpoint);
    if let Some(token) = token {
        command.env("DEADBOLT_ACCESS_TOKEN", token);
    }
    command.output().expect("run deadbolt")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .trim()
        .to_owned()
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
    let mut command = Command::new("curl");
    command.args(["-sS", "-w", "\n%{http_code}"]);
    command.args(["--cacert", &file("--ca"), "--cert", &file("--cert")]);
    command.args(["--key", &file("--key")]);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    for header in headers {
        command.args(["-H", header]);
    }
    if let Some(body) = body {
        command.args(["-d", &body.to_string()]);
    }
    let output = command
        .arg(format!("https://{addr}{path}"))
        .output()
        .expect("curl is installed");
    let text = String::from_utf8(output.stdout).unwrap();
    let (reply, status) = text
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("{text:?} {}", String::from_utf8_lossy(&output.stderr)));
    let reply = serde_json::from_str(reply).unwrap_or(Value::String(reply.to_owned()));
    (status.parse().unwrap(), reply)
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
    let history = cli(
        &cluster,
        &at_follower,
        Some(&root),
        &["history", "--lock", "jobs/b", "--json"],
    );
    let history: Value = serde_json::from_str(&stdout(&history)).unwrap();
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

/// The issue's test: a round-robin TCP load balancer in front of the three
/// nodes (haproxy, passing TLS through), and clients given its address
/// only. The leader is killed while a session holds one lock and a worker
/// takes and gives back another: the holder keeps its lock, the worker's
/// tokens keep growing under the new leader, and the CLI and curl work
/// through the balancer whichever node it picks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_load_balancer_clients_keep_working_while_the_leader_dies() {
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
    let busy = tokio::spawn({
        let session = session.clone();
        async move {
            let (mut grants, mut errors) = (Vec::new(), Vec::new());
            while !*stopped.borrow() {
                match session.lock("jobs/busy").await {
                    Ok(guard) => {
                        grants.push((Instant::now(), guard.token()));
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
    let killed = Instant::now();
    let new_leader = cluster.leader_within(Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);
    // The worker goes on under the new leader, through any node.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.send(true).unwrap();
    let (grants, errors) = busy.await.unwrap();

    assert!(errors.is_empty(), "surfaced to the worker: {errors:?}");
    let tokens: Vec<u64> = grants.iter().map(|(_, token)| *token).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let after_kill = grants.iter().filter(|(at, _)| *at > killed).count();
    assert!(after_kill >= 10, "{after_kill} grants after the kill");
    assert!(!session.is_lost(), "the holder's lease was lost");

    // The CLI and curl, through whichever node the balancer picks.
    for _ in 0..3 {
        let status = cli(
            &cluster,
            &at_balancer,
            Some(&worker),
            &["status", "--lock", "jobs/held", "--json"],
        );
        let status: Value = serde_json::from_str(&stdout(&status)).unwrap();
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
