//! Watches as users meet them: the Rust client's stream, `curl -N` on the
//! Server-Sent Events and the long poll, `deadbolt watch`, against real
//! servers; resumed after a last event, across the kill of the node that
//! served it, and refused with `compacted` when the history is gone.

mod common;

use common::{deadbolt, TestServer, BIN};
use deadbolt_client::{Client, ErrorKind, Watch, WatchEvent, WatchOptions};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The next `count` events of `watch`, failing the test after 10 s.
async fn take(watch: &mut Watch, count: usize) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    while events.len() < count {
        let next = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
        let event = next
            .unwrap_or_else(|_| panic!("only {} events came: {events:?}", events.len()))
            .expect("the watch goes on")
            .expect("no error");
        events.push(event);
    }
    events
}

/// `(kind, name)` of each event.
fn kinds(events: &[WatchEvent]) -> Vec<(&str, &str)> {
    events
        .iter()
        .map(|event| (event.kind.as_str(), event.name.as_str()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_watch_sees_every_primitive_in_order_and_resumes_after_any_event() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    common::wait_for_newest_cluster_version(&server.endpoint());
    let client = server.client().await;
    let mut watch = client.watch(
        "jobs/",
        WatchOptions {
            prefix: true,
            ..Default::default()
        },
    );
    watch.started().await.unwrap();
    let session = client.open_session(Duration::from_secs(10)).await.unwrap();
    let lock = session.lock("jobs/a").await.unwrap();
    let lock_token = lock.token();
    session
        .lock("other/x")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    lock.release().await.unwrap();
    let permits = session.acquire_permits("jobs/s", 3, 2).await.unwrap();
    let shared = session.read_lock("jobs/rw").await.unwrap();
    let leading = session.campaign("jobs/e", "v1").await.unwrap();
    leading.proclaim("v2").await.unwrap();
    client.store_put("jobs/k", "x", 7, None).await.unwrap();
    session.close().await.unwrap();
    let events = take(&mut watch, 10).await;
    assert_eq!(
        kinds(&events[..7]),
        [
            ("granted", "jobs/a"),
            ("released", "jobs/a"),
            ("granted", "jobs/s"),
            ("granted", "jobs/rw"),
            ("granted", "jobs/e"),
            ("proclaimed", "jobs/e"),
            ("put", "jobs/k"),
        ]
    );
    // Closing the session ends its three grants, in one entry.
    let mut closed = kinds(&events[7..]);
    closed.sort();
    assert_eq!(
        closed,
        [
            ("closed", "jobs/e"),
            ("closed", "jobs/rw"),
            ("closed", "jobs/s")
        ]
    );
    assert!(events[7..]
        .iter()
        .all(|event| event.index == events[7].index));
    let by_kind = |kind: &str, name: &str| {
        events
            .iter()
            .find(|event| event.kind == kind && event.name == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {events:?}"))
    };
    assert_eq!(by_kind("granted", "jobs/a").token, lock_token);
    assert_eq!(by_kind("released", "jobs/a").token, lock_token);
    assert_eq!(by_kind("granted", "jobs/s").permits, 2);
    assert_eq!(by_kind("granted", "jobs/s").token, permits.token());
    assert_eq!(by_kind("granted", "jobs/rw").mode, "shared");
    assert_eq!(by_kind("granted", "jobs/rw").token, shared.token());
    assert_eq!(by_kind("granted", "jobs/e").value.as_deref(), Some("v1"));
    assert_eq!(by_kind("proclaimed", "jobs/e").value.as_deref(), Some("v2"));
    assert_eq!(by_kind("proclaimed", "jobs/e").token, leading.token());
    assert_eq!(by_kind("put", "jobs/k").value.as_deref(), Some("x"));
    assert!(events
        .iter()
        .all(|event| event.session_id != 0 || event.kind == "put"));
    // Log order: indexes never go back, ids never repeat.
    let places: Vec<(u64, u32)> = events.iter().map(|e| (e.index, e.position)).collect();
    assert!(
        places.windows(2).all(|pair| pair[0] < pair[1]),
        "{places:?}"
    );
    // Resumed after any event, a watch gives exactly the rest.
    for (seen, last) in events.iter().enumerate() {
        let options = WatchOptions {
            prefix: true,
            after: Some(last.id.clone()),
        };
        let mut resumed = client.watch("jobs/", options);
        let rest = take(&mut resumed, events.len() - seen - 1).await;
        assert_eq!(rest, events[seen + 1..], "after {}", last.id);
    }
}

/// The output lines of `command`, as they come.
fn lines_of(mut command: Command) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let (send, lines) = mpsc::channel();
    let output = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in output.lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

fn next_line(lines: &mpsc::Receiver<String>) -> String {
    lines
        .recv_timeout(Duration::from_secs(10))
        .expect("a line within 10 s")
}

/// `curl -N` reading a watch as Server-Sent Events.
fn sse(server: &TestServer, query: &str, last_event_id: Option<&str>) -> Command {
    let mut curl = Command::new("curl");
    curl.args(["-sSN", "-H", "Accept: text/event-stream"]);
    if let Some(id) = last_event_id {
        curl.args(["-H", &format!("Last-Event-ID: {id}")]);
    }
    curl.arg(format!("http://{}/v1/watch?{query}", server.addr));
    curl
}

/// The SSE fields of the next event: (id, event, data).
fn next_sse_event(lines: &mpsc::Receiver<String>) -> (String, String, serde_json::Value) {
    let mut fields = std::collections::BTreeMap::new();
    loop {
        let line = next_line(lines);
        if line.is_empty() {
            if fields.contains_key("data") {
                break;
            }
            continue;
        }
        if line.starts_with(':') {
            continue; // a keep-alive comment
        }
        let (field, value) = line.split_once(": ").unwrap_or((&line, ""));
        fields.insert(field.to_owned(), value.to_owned());
    }
    let data = serde_json::from_str(&fields["data"]).unwrap();
    (fields["id"].clone(), fields["event"].clone(), data)
}

#[test]
fn curl_follows_a_watch_as_server_sent_events_and_resumes_from_last_event_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    // From the log's start (nothing is compacted yet), so the run's events
    // come whenever curl connects.
    let (mut first, lines) = lines_of(sse(&server, "name=nightly&after=0", None));
    let ran = deadbolt(&endpoint, &["run", "--lock", "nightly", "--", "true"]);
    assert!(ran.status.success(), "{ran:?}");
    let (granted_id, granted, data) = next_sse_event(&lines);
    assert_eq!(granted, "granted");
    assert_eq!(data["name"], "nightly");
    assert_eq!(data["id"], granted_id.as_str());
    let (released_id, released, _) = next_sse_event(&lines);
    assert_eq!(released, "released");
    first.kill().unwrap();
    first.wait().unwrap();
    // A client that reconnects with the last id it saw gets what followed.
    let (mut again, lines) = lines_of(sse(&server, "name=nightly", Some(&granted_id)));
    let (id, event, _) = next_sse_event(&lines);
    assert_eq!(
        (id.as_str(), event.as_str()),
        (released_id.as_str(), "released")
    );
    again.kill().unwrap();
    again.wait().unwrap();
    // The long poll: the events after an index, and where to ask next.
    let after = granted_id
        .split('.')
        .next()
        .unwrap()
        .parse::<u64>()
        .unwrap()
        - 1;
    let (status, answer) = common::curl(
        server.addr,
        None,
        &format!("/v1/watch?name=nightly&after={after}&timeout_ms=100"),
        None,
    );
    assert_eq!(status, 200, "{answer}");
    let events = answer["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{answer}");
    assert_eq!(events[1]["id"], released_id.as_str());
    // Nothing more: an empty answer after the timeout, still resumable.
    let cursor = answer["cursor"].as_str().unwrap();
    let (status, idle) = common::curl(
        server.addr,
        None,
        &format!("/v1/watch?name=nightly&after={cursor}&timeout_ms=100"),
        None,
    );
    assert_eq!(
        (status, idle["events"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{idle}"
    );
    let (status, bad) = common::curl(server.addr, None, "/v1/watch?name=x&after=soon", None);
    assert_eq!(status, 400, "{bad}");
    assert!(bad["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not an event id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_history_the_node_no_longer_keeps_ends_with_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let flags = ["--snapshot-every", "10"];
    let mut server = TestServer::start_with(&data, addr, &flags);
    let client = server.client().await;
    let session = client.open_session(Duration::from_secs(10)).await.unwrap();
    for _ in 0..15 {
        session.lock("busy").await.unwrap().release().await.unwrap();
    }
    drop(client);
    // Restarted, the node has only the snapshot and the log after it.
    server.kill9();
    let server = TestServer::start_with(&data, addr, &flags);
    let endpoint = server.endpoint();
    let watched = deadbolt(&endpoint, &["watch", "--prefix", "", "--from", "1"]);
    assert_eq!(watched.status.code(), Some(1), "{watched:?}");
    let said = String::from_utf8_lossy(&watched.stderr);
    assert!(said.contains("history this watch needs is gone"), "{said}");
    let (status, answer) = common::curl(server.addr, None, "/v1/watch?name=busy&after=0", None);
    assert_eq!(status, 410, "{answer}");
    assert_eq!(answer["error"]["kind"], "compacted");
    let current = answer["error"]["current_index"].as_u64().unwrap();
    assert!(
        answer["error"]["kept_after"].as_u64().unwrap() >= 10,
        "{answer}"
    );
    // From the index it names, the watch goes on.
    let client = server.client().await;
    let options = WatchOptions {
        after: Some(current.to_string()),
        ..Default::default()
    };
    let mut watch = client.watch("busy", options);
    let session = client.open_session(Duration::from_secs(10)).await.unwrap();
    session.lock("busy").await.unwrap().release().await.unwrap();
    let events = take(&mut watch, 2).await;
    assert_eq!(kinds(&events), [("granted", "busy"), ("released", "busy")]);
    assert!(events[0].index > current);
}

/// How a client starts again after `compacted`: a status read gives the
/// log index of the state it read, and a watch after that index goes on
/// from exactly that state: the grant the read saw is not repeated, and
/// nothing after it is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_after_a_status_reads_index_follows_on_from_that_state() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let client = server.client().await;
    let (a, b) = (
        client.open_session(Duration::from_secs(10)).await.unwrap(),
        client.open_session(Duration::from_secs(10)).await.unwrap(),
    );
    let first = a.lock("restart").await.unwrap();
    let first_token = first.token();
    let (state, index) = client.lock_status_with_index("restart").await.unwrap();
    assert_eq!(state.unwrap().token, first_token);
    let shown = deadbolt(
        &server.endpoint(),
        &["status", "--lock", "restart", "--json"],
    );
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert!(shown["index"].as_u64().unwrap() >= index, "{shown}");

    let after = |index: u64| WatchOptions {
        after: Some(index.to_string()),
        ..Default::default()
    };
    let mut watch = client.watch("restart", after(index));
    watch.started().await.unwrap();
    first.release().await.unwrap();
    let second = b.lock("restart").await.unwrap();
    let second_token = second.token();
    second.release().await.unwrap();
    let events = take(&mut watch, 3).await;
    let seen: Vec<_> = events.iter().map(|e| (e.kind.as_str(), e.token)).collect();
    assert_eq!(
        seen,
        [
            ("released", first_token),
            ("granted", second_token),
            ("released", second_token),
        ]
    );
    assert!(events[0].index > index);
    // The grant the read saw came at or before its index.
    let mut from_the_start = client.watch("restart", after(0));
    let granted = take(&mut from_the_start, 1).await;
    assert_eq!(kinds(&granted), [("granted", "restart")]);
    assert!(granted[0].index <= index, "{granted:?} after index {index}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_goes_on_without_a_gap_when_the_node_serving_it_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = common::start_cluster(dir.path(), 3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    let others: Vec<String> = (1..=3)
        .filter(|id| *id != leader)
        .map(|id| cluster.node(id).endpoint())
        .collect();
    // The leader first: the watch starts there, calls go there.
    let endpoints = [vec![cluster.node(leader).endpoint()], others.clone()].concat();
    let client = Client::connect(endpoints).await.unwrap();
    let mut watch = client.watch("k", WatchOptions::default());
    watch.started().await.unwrap();
    let cycles = |client: Client| async move {
        let session = client.open_session(Duration::from_secs(10)).await.unwrap();
        for _ in 0..5 {
            session.lock("k").await.unwrap().release().await.unwrap();
        }
        session.close().await.unwrap();
    };
    cycles(client.clone()).await;
    let before = take(&mut watch, 10).await;
    cluster.kill9(leader);
    cluster.wait_for_leader(Duration::from_secs(20));
    cycles(Client::connect(others).await.unwrap()).await;
    let after = take(&mut watch, 10).await;
    let events: Vec<WatchEvent> = before.into_iter().chain(after).collect();
    // Granted, released, granted, ...: each release the grant before it,
    // every grant's token above the last.
    let mut last_token = 0;
    for pair in events.chunks(2) {
        assert_eq!(
            kinds(pair),
            [("granted", "k"), ("released", "k")],
            "{events:?}"
        );
        assert_eq!(pair[0].token, pair[1].token);
        assert!(pair[0].token > last_token, "{events:?}");
        last_token = pair[0].token;
    }
}

/// Regression (a nemesis run over TLS, 2026-12-04): a follower restarted a
/// moment before had not applied the workers' bearer token yet, so it sent
/// the watch to the leader with `not_leader`, and the watch ended there
/// instead of following. A token no node knows takes the same path on a
/// follower, deterministically: the watch must reach the leader, whose
/// answer (the token is unknown) is the one that ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_by_a_follower_that_cannot_check_its_token_follows_to_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start_cluster(dir.path(), 3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let client = Client::connect_with_token(
        [cluster.node(follower).endpoint()],
        &Default::default(),
        Some("dbt.nobody.0123456789abcdef"),
    )
    .await
    .unwrap();
    let mut watch = client.watch("k", WatchOptions::default());
    let error = watch.started().await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unauthenticated, "{error}");
    assert!(error.to_string().contains("unknown token"), "{error}");
}

#[test]
fn deadbolt_watch_prints_a_line_per_event_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let ran = deadbolt(&endpoint, &["run", "--lock", "report", "--", "true"]);
    assert!(ran.status.success(), "{ran:?}");
    let mut watch = Command::new(BIN);
    watch
        .args(["watch", "--lock", "report", "--from", "1"])
        .env("DEADBOLT_ENDPOINT", &endpoint);
    let (mut watcher, lines) = lines_of(watch);
    let granted = next_line(&lines);
    let released = next_line(&lines);
    let fields = |line: &str| line.split(' ').map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(fields(&granted)[1..3], ["granted", "report"], "{granted}");
    assert_eq!(
        fields(&released)[1..3],
        ["released", "report"],
        "{released}"
    );
    let token = |line: &str| {
        fields(line)
            .into_iter()
            .find_map(|field| field.strip_prefix("token=").map(str::to_owned))
    };
    assert_eq!(token(&granted), token(&released));
    // Resumed after the grant's id, the release comes first.
    let id = fields(&granted)[0].clone();
    let mut resumed = Command::new(BIN);
    resumed
        .args(["watch", "--lock", "report", "--json", "--after", &id])
        .env("DEADBOLT_ENDPOINT", &endpoint);
    let (mut resumer, json_lines) = lines_of(resumed);
    let event: serde_json::Value = serde_json::from_str(&next_line(&json_lines)).unwrap();
    assert_eq!(event["kind"], "released");
    assert_eq!(event["id"], fields(&released)[0].as_str());
    for child in [&mut watcher, &mut resumer] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
