//! `GET /metrics` on the real binary: a known workload moves each counter by
//! exactly what it did, and what the server exposes passes a tool nobody
//! here wrote, `promtool` (Debian's `prometheus` package): `check metrics`
//! on a scrape, `check rules` on the example alerting rules.
//!
//! `promtool` is `$DEADBOLT_PROMTOOL` (then it must run: `scripts/test.sh`
//! sets it from `scripts/promtool.sh`), else the one on PATH; without
//! either, the promtool checks are skipped, loudly.

mod common;

use common::{post, start_cluster, TestServer};
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The example alerting rules that docs/operations.md describes.
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../packaging/prometheus/deadbolt-alerts.yml"
);

/// Acquire-release pairs in the workload.
const PAIRS: u64 = 5;

/// One scrape: each sample's value by its series as exposed
/// (`name{label="value"}`).
struct Scrape {
    text: String,
    samples: HashMap<String, f64>,
}

impl Scrape {
    fn get(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in the scrape:\n{}", self.text))
    }

    /// How much `series` moved since `before`.
    fn delta(&self, before: &Scrape, series: &str) -> f64 {
        self.get(series) - before.get(series)
    }
}

/// `curl` the scrape: a real HTTP client, and the command the docs show.
fn scrape(endpoint: &str) -> Scrape {
    let url = format!("{endpoint}/metrics");
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--max-time", "10"])
        .arg(&url)
        .output()
        .expect("run curl (install it: apt-get install curl)");
    assert!(output.status.success(), "curl {url}: {output:?}");
    let text = String::from_utf8(output.stdout).expect("the scrape is UTF-8");
    let samples = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let value = value.parse().unwrap_or_else(|_| panic!("{line:?}"));
            (series.to_owned(), value)
        })
        .collect();
    Scrape { text, samples }
}

/// Scrapes until `series` reads `value`, for what another thread does.
fn scrape_until(server: &TestServer, series: &str, value: f64) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = scrape(&server.endpoint());
        if scrape.get(series) == value {
            return scrape;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {}, not {value}",
            scrape.get(series)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The promtool to check with, or `None` (after saying so) to skip.
fn promtool() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DEADBOLT_PROMTOOL") {
        let path = PathBuf::from(path);
        let runs = Command::new(&path).arg("--version").output();
        assert!(
            runs.is_ok_and(|output| output.status.success()),
            "DEADBOLT_PROMTOOL={} does not run; `scripts/promtool.sh` installs it",
            path.display()
        );
        return Some(path);
    }
    if Command::new("promtool").arg("--version").output().is_ok() {
        return Some(PathBuf::from("promtool"));
    }
    // Straight to stderr: the harness swallows a passing test's output, and
    // a skip nobody sees is a silent pass.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** promtool checks skipped: no promtool on PATH and DEADBOLT_PROMTOOL unset \
         (scripts/test.sh sets it) ***\n"
    );
    None
}

/// Runs `promtool ARGS`, with `stdin` as its input, and asserts it is content.
fn promtool_accepts(promtool: &Path, args: &[&str], stdin: &str) {
    let mut child = Command::new(promtool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool {args:?} refused it:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A session's id and secret.
type Session = (u64, String);

fn open_session(server: &TestServer, ttl_ms: u64) -> Session {
    let (status, body) = post(server.addr, "/v1/session/open", json!({ "ttl_ms": ttl_ms }));
    assert_eq!(status, 200, "{body}");
    let secret = body["session_secret"].as_str().unwrap().to_owned();
    (body["session_id"].as_u64().unwrap(), secret)
}

fn acquire(server: &TestServer, (session, secret): &Session, lock: &str) -> u64 {
    let request = json!({ "session_id": session, "session_secret": secret, "lock": lock });
    let (status, body) = post(server.addr, "/v1/lock/acquire", request);
    assert_eq!(status, 200, "{body}");
    body["token"].as_u64().unwrap()
}

fn release(server: &TestServer, (session, secret): &Session, lock: &str, token: u64) {
    let request = json!({
        "session_id": session, "session_secret": secret, "lock": lock, "token": token
    });
    let (status, body) = post(server.addr, "/v1/lock/release", request);
    assert_eq!(status, 200, "{body}");
}

fn store_put(server: &TestServer, token: u64) -> u16 {
    let request = json!({ "key": "k", "value": token.to_string(), "token": token });
    post(server.addr, "/v1/store/put", request).0
}

#[test]
fn a_known_workload_moves_each_metric_by_exactly_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let before = scrape(&server.endpoint());

    // Session A: PAIRS acquire-release pairs, one keepalive, a fenced put
    // with its newest token and one with its first (stale).
    let a = open_session(&server, 60_000);
    let mut tokens = Vec::new();
    for i in 0..PAIRS {
        let lock = format!("pair-{i}");
        let token = acquire(&server, &a, &lock);
        release(&server, &a, &lock, token);
        tokens.push(token);
    }
    let (status, body) = post(
        server.addr,
        "/v1/session/keepalive",
        json!({ "session_id": a.0, "session_secret": a.1 }),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(store_put(&server, *tokens.last().unwrap()), 200);
    assert_eq!(store_put(&server, tokens[0]), 409);

    // So far, every command went through the proposer on its own (each
    // call waited for the previous one), and a single node appends each
    // entry by itself.
    let mid = scrape(&server.endpoint());
    let moved = |series: &str| mid.delta(&before, series);
    let commands = (1 + 2 * PAIRS + 2) as f64;
    assert_eq!(moved("deadbolt_proposer_batch_commands_sum"), commands);
    assert_eq!(moved("deadbolt_proposer_batch_commands_count"), commands);
    for entries in [
        "deadbolt_proposal_commit_duration_seconds_count",
        "deadbolt_log_append_duration_seconds_count",
        "deadbolt_raft_last_log_index",
        "deadbolt_raft_applied_index",
    ] {
        assert_eq!(moved(entries), commands, "{entries}");
    }

    // Session B, with a short lease it never renews, queues behind A for a
    // lock, gets it when A releases it, and expires holding it.
    let ttl = Duration::from_secs(3);
    let b = open_session(&server, ttl.as_millis() as u64);
    let held = acquire(&server, &a, "queue");
    let addr = server.addr;
    let waiter = std::thread::spawn(move || {
        let request = json!({
            "session_id": b.0, "session_secret": b.1, "lock": "queue", "wait": true
        });
        post(addr, "/v1/lock/acquire", request)
    });
    let queued = scrape_until(&server, "deadbolt_lock_waiters", 1.0);
    assert_eq!(queued.get("deadbolt_locks_held"), 1.0);
    assert_eq!(queued.get("deadbolt_sessions"), 2.0);
    release(&server, &a, "queue", held);
    let (status, body) = waiter.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let after = scrape_until(&server, "deadbolt_sessions", 1.0);

    let moved = |series: &str| after.delta(&before, series);
    // Grants: the pairs, A's "queue", B's "queue". Releases: the pairs, A's
    // release of "queue", B's grant ended by its expiry.
    assert_eq!(moved("deadbolt_grants_total"), (PAIRS + 2) as f64);
    assert_eq!(moved("deadbolt_releases_total"), (PAIRS + 2) as f64);
    assert_eq!(moved("deadbolt_sessions_opened_total"), 2.0);
    assert_eq!(moved("deadbolt_session_expiries_total"), 1.0);
    assert_eq!(moved("deadbolt_lease_renewals_total"), 1.0);
    let accepted = r#"deadbolt_fenced_store_writes_total{result="accepted"}"#;
    let stale = r#"deadbolt_fenced_store_writes_total{result="stale"}"#;
    assert_eq!(moved(accepted), 1.0);
    assert_eq!(moved(stale), 1.0);
    assert_eq!(moved(r#"deadbolt_errors_total{kind="stale_token"}"#), 1.0);
    let errors: f64 = ["busy", "not_leader", "unavailable", "internal"]
        .iter()
        .map(|kind| moved(&format!(r#"deadbolt_errors_total{{kind="{kind}"}}"#)))
        .sum();
    assert_eq!(errors, 0.0);

    // B's lease went quiet at half its TTL, so the leader checkpointed it
    // (every tenth of the TTL) before it ran out.
    let checkpoints = moved("deadbolt_lease_checkpoints_total");
    assert!(checkpoints >= 1.0, "{checkpoints} checkpoints");

    let calls = |call: &str| {
        moved(&format!(
            r#"deadbolt_request_duration_seconds_count{{call="{call}"}}"#
        ))
    };
    assert_eq!(calls("open_session"), 2.0);
    assert_eq!(calls("acquire"), (PAIRS + 2) as f64);
    assert_eq!(calls("release"), (PAIRS + 1) as f64);
    assert_eq!(calls("keep_alive"), 1.0);
    assert_eq!(calls("store_put"), 2.0);
    let waited = r#"deadbolt_acquire_wait_duration_seconds_count{result="granted"}"#;
    assert_eq!(moved(waited), 1.0);

    assert_eq!(after.get("deadbolt_sessions"), 1.0);
    assert_eq!(after.get("deadbolt_locks_held"), 0.0);
    assert_eq!(after.get("deadbolt_lock_waiters"), 0.0);
    assert_eq!(after.get("deadbolt_raft_is_leader"), 1.0);
    assert_eq!(after.get("deadbolt_raft_has_leader"), 1.0);
    assert_eq!(after.get("deadbolt_raft_leader_changes_total"), 1.0);
    assert_eq!(after.get("deadbolt_raft_apply_lag_entries"), 0.0);
    assert_eq!(after.get("deadbolt_proposer_queued_commands"), 0.0);
    assert_eq!(
        after.get("deadbolt_raft_applied_index"),
        after.get("deadbolt_raft_last_log_index")
    );

    if let Some(promtool) = promtool() {
        promtool_accepts(&promtool, &["check", "metrics"], &after.text);
    }
}

/// On a 3-node cluster: each node's own view of leadership and the
/// leader's of its followers, every scrape valid, and every metric the
/// example alerting rules use exposed by some node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_exposes_every_metric_the_example_alerts_use() {
    let rules = std::fs::read_to_string(RULES).expect("read the example alerting rules");
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(dir.path(), 3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let scrapes: Vec<(u64, Scrape)> = (1..=3)
        .map(|id| (id, scrape(&cluster.node(id).endpoint())))
        .collect();
    let promtool = promtool();
    // Every node says which build it runs, with the numbers `deadbolt
    // version` prints; so does `cluster status`, member by member.
    let version = Command::new(common::BIN)
        .args(["version", "--json"])
        .output()
        .unwrap();
    let version: serde_json::Value = serde_json::from_slice(&version.stdout).unwrap();
    let build_info = format!(
        r#"deadbolt_build_info{{release="{}",data_format="{}",backup_format="{}",peer_protocol="{}",client_api="{}",feature_level="{}"}}"#,
        version["release"].as_str().unwrap(),
        version["data_format"],
        version["backup_format"],
        version["peer_protocol"],
        version["client_api"],
        version["feature_level"]
    );
    let status = common::deadbolt(
        &cluster.node(1).endpoint(),
        &["cluster", "status", "--json"],
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    for member in status["members"].as_array().unwrap() {
        assert_eq!(member["state"]["versions"], version, "{member}");
    }
    for (id, scrape) in &scrapes {
        assert_eq!(scrape.get(&build_info), 1.0, "node {id}: {}", scrape.text);
        let leads = f64::from(*id == leader);
        assert_eq!(scrape.get("deadbolt_raft_is_leader"), leads, "node {id}");
        assert_eq!(scrape.get("deadbolt_raft_has_leader"), 1.0, "node {id}");
        for peer in (1..=3).filter(|peer| peer != id) {
            let lag = format!(r#"deadbolt_raft_replication_lag_entries{{peer="{peer}"}}"#);
            // Only the leader has followers to report.
            assert_eq!(
                scrape.samples.contains_key(&lag),
                *id == leader,
                "{lag} on node {id}"
            );
        }
        if let Some(promtool) = &promtool {
            promtool_accepts(promtool, &["check", "metrics"], &scrape.text);
        }
    }

    let families: Vec<&str> = scrapes
        .iter()
        .flat_map(|(_, scrape)| scrape.text.lines())
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split(' ').next())
        .collect();
    // Every `deadbolt_*` name a rule uses is a family, or a histogram's
    // `_bucket`/`_sum`/`_count` series of one.
    let names = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("deadbolt_"));
    for name in names {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            families.contains(&name) || families.contains(&family),
            "{RULES} uses {name}, which no node exposes"
        );
    }
    if let Some(promtool) = &promtool {
        promtool_accepts(promtool, &["check", "rules", RULES], "");
    }
}
