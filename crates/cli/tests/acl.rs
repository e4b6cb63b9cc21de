//! Access control as a new user meets it: `deadbolt acl` to turn it on and
//! hand out least-privilege tokens, then `curl` (a client nobody here
//! wrote) and the CLI against a real server. Every refusal is checked to
//! have changed nothing.

mod common;

use common::{as_token, curl, deadbolt, stdout, TestServer};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Command, Output};

/// `deadbolt acquire --lock LOCK` with `token`: the session handle and the
/// fencing token, as printed.
fn acquire(endpoint: &str, token: &str, lock: &str) -> (String, String) {
    let granted = stdout(&as_token(
        endpoint,
        Some(token),
        &["acquire", "--lock", lock],
    ));
    let (handle, fencing) = granted.split_once(' ').unwrap();
    (handle.to_owned(), fencing.to_owned())
}

/// The `deadbolt release` arguments for what [`acquire`] printed.
fn release_args<'a>(lock: &'a str, handle: &'a str, fencing: &'a str) -> [&'a str; 7] {
    [
        "release",
        "--lock",
        lock,
        "--session",
        handle,
        "--token",
        fencing,
    ]
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Bootstraps access control on `server`: a role `jobs` (lock and read
/// under `jobs/`) held by identities `ci` and `ops`, and a token for each.
/// Returns (root, ci, ops) tokens.
fn secured(server: &TestServer) -> (String, String, String) {
    let endpoint = server.endpoint();
    let root = stdout(&deadbolt(&endpoint, &["acl", "bootstrap"]));
    assert!(root.starts_with("dbt."), "{root}");
    let admin = |args: &[&str]| stdout(&as_token(&endpoint, Some(&root), args));
    admin(&["acl", "role", "put", "jobs", "lock:jobs/", "read:jobs/"]);
    admin(&["acl", "grant", "ci", "jobs"]);
    admin(&["acl", "grant", "ops", "jobs"]);
    let ci = admin(&["acl", "token", "create", "ci"]);
    let ops = admin(&["acl", "token", "create", "ops"]);
    (root, ci, ops)
}

#[test]
fn a_token_allows_exactly_what_its_roles_grant_and_a_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let addr = server.addr;

    // Off: everything is allowed, as on the loopback default.
    let (status, _) = curl(addr, None, "/v1/lock/status?lock=jobs/a", None);
    assert_eq!(status, 200);
    let (root, ci, _) = secured(&server);

    // A second bootstrap is refused, anonymously or by root.
    let again = deadbolt(&endpoint, &["acl", "bootstrap"]);
    assert_eq!(again.status.code(), Some(77), "{again:?}");
    let again = as_token(&endpoint, Some(&root), &["acl", "bootstrap"]);
    assert_eq!(again.status.code(), Some(77), "{again:?}");
    assert!(stderr(&again).contains("already on"), "{}", stderr(&again));

    // On: anonymous calls are unauthenticated (401); /health stays open.
    for path in [
        "/v1/lock/status?lock=jobs/a",
        "/v1/locks",
        "/metrics",
        "/v1/acl",
    ] {
        let (status, reply) = curl(addr, None, path, None);
        assert_eq!(status, 401, "{path}: {reply}");
        assert_eq!(reply["error"]["kind"], "unauthenticated", "{reply}");
    }
    let (status, _) = curl(addr, None, "/health", None);
    assert_eq!(status, 200);
    let (status, reply) = curl(addr, Some("dbt.0000.1111"), "/v1/locks", None);
    assert_eq!(
        (status, reply["error"]["kind"].as_str()),
        (401, Some("unauthenticated"))
    );

    // ci may lock and read under jobs/, nothing else.
    let (session, _) = acquire(&endpoint, &ci, "jobs/a");
    let (status, reply) = curl(addr, Some(&ci), "/v1/lock/status?lock=jobs/a", None);
    assert_eq!(status, 200, "{reply}");
    assert!(reply["state"]["token"].as_u64().unwrap() > 0);
    let web = as_token(&endpoint, Some(&ci), &["acquire", "--lock", "web/a"]);
    assert_eq!(web.status.code(), Some(77), "{web:?}");
    assert!(
        stderr(&web).contains(r#"identity "ci" has no lock permission on "web/a""#),
        "{}",
        stderr(&web)
    );
    for (path, body) in [
        (
            "/v1/store/put",
            json!({"key": "jobs/k", "value": "v", "token": 1}),
        ),
        ("/v1/cluster/remove", json!({"node_id": 1})),
        ("/v1/acl/token/create", json!({"identity": "ci"})),
        ("/v1/acl/grant", json!({"identity": "ci", "role": "root"})),
    ] {
        let (status, reply) = curl(addr, Some(&ci), path, Some(&body));
        assert_eq!(status, 403, "{path}: {reply}");
        assert_eq!(reply["error"]["kind"], "permission_denied", "{reply}");
    }
    let (status, reply) = curl(addr, Some(&ci), "/v1/lock/status?lock=web/a", None);
    assert_eq!(status, 403, "{reply}");

    // Semaphores follow the same prefixes: `lock` to take permits, `read`
    // to see who holds them.
    common::wait_for_newest_cluster_version(&endpoint);
    let permits = |name: &str| {
        let args = ["acquire", "--semaphore", name, "--permits", "2"];
        as_token(&endpoint, Some(&ci), &args)
    };
    stdout(&permits("jobs/pool"));
    let web_pool = permits("web/pool");
    assert_eq!(web_pool.status.code(), Some(77), "{web_pool:?}");
    assert!(
        stderr(&web_pool).contains(r#"identity "ci" has no lock permission on "web/pool""#),
        "{}",
        stderr(&web_pool)
    );
    for (name, allowed) in [("jobs/pool", 200), ("web/pool", 403)] {
        let path = format!("/v1/semaphore/status?semaphore={name}");
        let (status, reply) = curl(addr, Some(&ci), &path, None);
        assert_eq!(status, allowed, "{path}: {reply}");
    }
    // So do read/write locks and elections.
    for args in [
        &["acquire", "--lock", "web/doc", "--shared"][..],
        &["acquire", "--election", "web/leader"][..],
    ] {
        let refused = as_token(&endpoint, Some(&ci), args);
        assert_eq!(refused.status.code(), Some(77), "{args:?}: {refused:?}");
    }
    stdout(&as_token(
        &endpoint,
        Some(&ci),
        &["acquire", "--election", "jobs/leader"],
    ));
    for (name, allowed) in [("jobs/leader", 200), ("web/leader", 403)] {
        let path = format!("/v1/election/leader?election={name}");
        let (status, reply) = curl(addr, Some(&ci), &path, None);
        assert_eq!(status, allowed, "{path}: {reply}");
    }

    // Listing shows only what ci may read; root sees everything, and
    // nothing was taken or stored by the refused calls.
    let root_acquire = as_token(&endpoint, Some(&root), &["acquire", "--lock", "other"]);
    stdout(&root_acquire);
    let (_, listed) = curl(addr, Some(&ci), "/v1/locks", None);
    let names: Vec<&str> = listed["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lock| lock["lock"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["jobs/a"]);
    let (_, listed) = curl(addr, Some(&root), "/v1/locks", None);
    assert_eq!(listed["locks"].as_array().unwrap().len(), 2, "{listed}");
    // The dashboard's reads follow the same rules; the page itself is open.
    let (_, page) = curl(addr, Some(&ci), "/ui/api/locks", None);
    let rows: Vec<&str> = page["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("{page}"))
        .iter()
        .map(|row| row["lock"].as_str().unwrap())
        .collect();
    assert_eq!(rows, ["jobs/a"]);
    let (status, _) = curl(addr, None, "/ui/api/cluster", None);
    assert_eq!(status, 401);
    let page = Command::new("curl")
        .args(["-sf", &format!("http://{addr}/ui")])
        .output()
        .unwrap();
    assert!(page.status.success(), "{page:?}");
    // A backup holds everything: admin only.
    let (status, reply) = curl(addr, Some(&ci), "/v1/snapshot", None);
    assert_eq!(status, 403, "{reply}");
    let backup = dir.path().join("backup");
    let saved = as_token(
        &endpoint,
        Some(&root),
        &["snapshot", "save", backup.to_str().unwrap()],
    );
    assert!(saved.status.success(), "{saved:?}");
    let (_, web) = curl(addr, Some(&root), "/v1/lock/status?lock=web/a", None);
    assert!(web["state"].is_null(), "{web}");
    let path = "/v1/semaphore/status?semaphore=web/pool";
    let (_, web) = curl(addr, Some(&root), path, None);
    assert!(web["state"].is_null(), "{web}");
    let (_, stored) = curl(addr, Some(&root), "/v1/store/get?key=jobs/k", None);
    assert_eq!(stored["found"], false, "{stored}");
    let (status, _) = curl(addr, Some(&root), "/metrics", None);
    assert_eq!(status, 200);

    // The trail names who held the lock.
    let (_, history) = curl(addr, Some(&ci), "/v1/lock/history?lock=jobs/a", None);
    assert_eq!(history["entries"][0]["identity"], "ci", "{history}");

    // A revoked token stops working at once; the session it opened stays
    // the identity's, usable with another token of that identity.
    let shown = stdout(&as_token(
        &endpoint,
        Some(&root),
        &["acl", "show", "--json"],
    ));
    let shown: Value = serde_json::from_str(&shown).unwrap();
    let ci_id = ci.split('.').nth(1).unwrap();
    assert!(shown["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .any(|token| token["token_id"] == ci_id && token["identity"] == "ci"));
    assert!(!shown.to_string().contains(ci.split('.').nth(2).unwrap()));
    stdout(&as_token(
        &endpoint,
        Some(&root),
        &["acl", "token", "revoke", ci_id],
    ));
    let revoked = as_token(&endpoint, Some(&ci), &["keepalive", "--session", &session]);
    assert_eq!(revoked.status.code(), Some(77), "{revoked:?}");
    assert!(stderr(&revoked).contains("revoked"), "{}", stderr(&revoked));
    let ci_again = stdout(&as_token(
        &endpoint,
        Some(&root),
        &["acl", "token", "create", "ci"],
    ));
    let renewed = as_token(
        &endpoint,
        Some(&ci_again),
        &["keepalive", "--session", &session],
    );
    stdout(&renewed);
}

#[test]
fn another_identitys_session_is_refused_even_with_its_secret() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let (root, ci, ops) = secured(&server);

    let (handle, token) = acquire(&endpoint, &ci, "jobs/a");

    // ops holds the same role, and has the session's handle (secret and
    // all): it still cannot release, renew or close ci's session.
    let release = release_args("jobs/a", &handle, &token);
    for args in [&release[..], &["keepalive", "--session", &handle]] {
        let refused = as_token(&endpoint, Some(&ops), args);
        assert_eq!(refused.status.code(), Some(77), "{refused:?}");
        assert!(
            stderr(&refused).contains(r#"belongs to identity "ci""#),
            "{}",
            stderr(&refused)
        );
    }
    let status = stdout(&as_token(
        &endpoint,
        Some(&root),
        &["status", "--lock", "jobs/a", "--json"],
    ));
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["state"]["token"].to_string(), token, "{status}");

    // Its owner can.
    stdout(&as_token(&endpoint, Some(&ci), &release));
    let history = stdout(&as_token(
        &endpoint,
        Some(&ci),
        &["history", "--lock", "jobs/a", "--json"],
    ));
    let history: Value = serde_json::from_str(&history).unwrap();
    let trail: Vec<(&str, &str)> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["what"].as_str().unwrap(), e["identity"].as_str().unwrap()))
        .collect();
    assert_eq!(trail, [("granted", "ci"), ("released", "ci")]);
}

#[test]
fn tokens_and_rules_survive_a_restart_a_snapshot_and_a_restore() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flags = ["--snapshot-every", "10"];
    let addr = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let mut server = TestServer::start_with(&data, addr, &flags);
    let endpoint = server.endpoint();
    let (root, ci, _) = secured(&server);
    // Enough entries for a snapshot and a purge of the log behind it.
    for _ in 0..12 {
        let (handle, token) = acquire(&endpoint, &ci, "jobs/a");
        let release = release_args("jobs/a", &handle, &token);
        stdout(&as_token(&endpoint, Some(&ci), &release));
    }
    server.terminate();
    let server = TestServer::start_with(&data, addr, &flags);
    let health = common::http(server.addr, "GET", "/health", None).unwrap().1;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert!(health["snapshot_index"].as_u64().unwrap() > 0, "{health}");

    let me = stdout(&as_token(
        &endpoint,
        Some(&ci),
        &["acl", "whoami", "--json"],
    ));
    let me: Value = serde_json::from_str(&me).unwrap();
    assert_eq!(
        (&me["identity"], &me["authenticated_by"]),
        (&json!("ci"), &json!("token"))
    );
    stdout(&as_token(
        &endpoint,
        Some(&ci),
        &["acquire", "--lock", "jobs/b"],
    ));
    let web = as_token(&endpoint, Some(&ci), &["acquire", "--lock", "web/b"]);
    assert_eq!(web.status.code(), Some(77), "{web:?}");
    let anonymous = deadbolt(&endpoint, &["status", "--lock", "jobs/b"]);
    assert_eq!(anonymous.status.code(), Some(77), "{anonymous:?}");
    stdout(&as_token(&endpoint, Some(&root), &["acl", "show"]));

    // A cluster restored from a backup keeps the rules and the tokens.
    let backup = dir.path().join("backup");
    let backup = backup.to_str().unwrap();
    stdout(&as_token(
        &endpoint,
        Some(&root),
        &["snapshot", "save", backup],
    ));
    let restored_dir = dir.path().join("restored");
    let restored_addr = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let restore = [
        "snapshot",
        "restore",
        backup,
        "--data-dir",
        restored_dir.to_str().unwrap(),
        "--listen",
        &restored_addr.to_string(),
    ];
    stdout(&deadbolt(&endpoint, &restore));
    let restored = TestServer::start_on(&restored_dir, restored_addr);
    let restored = restored.endpoint();
    stdout(&as_token(
        &restored,
        Some(&ci),
        &["acquire", "--lock", "jobs/c"],
    ));
    let web = as_token(&restored, Some(&ci), &["acquire", "--lock", "web/c"]);
    assert_eq!(web.status.code(), Some(77), "{web:?}");
}

#[test]
fn one_identity_cannot_hold_more_calls_than_its_limit_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let flags = ["--max-calls-per-identity", "2"];
    let server = TestServer::start_with(&dir.path().join("data"), addr, &flags);
    let endpoint = server.endpoint();
    let (root, ci, ops) = secured(&server);
    stdout(&as_token(
        &endpoint,
        Some(&ops),
        &["acquire", "--lock", "jobs/a"],
    ));

    // Two blocking acquires of ci wait for the lock ops holds: both of
    // ci's slots are taken while they wait.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            Command::new(common::BIN)
                .args(["acquire", "--lock", "jobs/a", "--wait", "60s"])
                .env("DEADBOLT_ENDPOINT", &endpoint)
                .env("DEADBOLT_ACCESS_TOKEN", &ci)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = std::time::Instant::now();
    loop {
        let status = stdout(&as_token(
            &endpoint,
            Some(&root),
            &["status", "--lock", "jobs/a", "--json"],
        ));
        let status: Value = serde_json::from_str(&status).unwrap();
        if status["state"]["waiter_session_ids"]
            .as_array()
            .unwrap()
            .len()
            == 2
        {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let third = as_token(&endpoint, Some(&ci), &["acquire", "--lock", "jobs/b"]);
    assert_eq!(third.status.code(), Some(1), "{third:?}");
    assert!(
        stderr(&third).contains(r#"identity "ci" has 2 calls in flight already"#),
        "{}",
        stderr(&third)
    );
    // Another identity is not held up.
    stdout(&as_token(
        &endpoint,
        Some(&ops),
        &["acquire", "--lock", "jobs/c"],
    ));
    for mut waiter in waiters {
        waiter.kill().unwrap();
        waiter.wait().unwrap();
    }
    // The slots come back when the callers go away.
    let started = std::time::Instant::now();
    while !as_token(&endpoint, Some(&ci), &["acquire", "--lock", "jobs/b"])
        .status
        .success()
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "slots never returned"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_watch_shows_only_what_its_identity_may_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let (root, ci, _) = secured(&server);
    let (handle, token) = acquire(&endpoint, &root, "other/x");
    stdout(&as_token(
        &endpoint,
        Some(&root),
        &release_args("other/x", &handle, &token),
    ));
    let (_, token) = acquire(&endpoint, &ci, "jobs/a");
    // Everything since the log began, as ci may see it: its own grant only.
    let everything = "/v1/watch?prefix=true&after=0&timeout_ms=100";
    let (status, seen) = curl(server.addr, Some(&ci), everything, None);
    assert_eq!(status, 200, "{seen}");
    let events: Vec<(&str, &str, &str)> = seen["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let field = |name: &str| e[name].as_str().unwrap();
            (field("kind"), field("name"), field("identity"))
        })
        .collect();
    assert_eq!(events, [("granted", "jobs/a", "ci")], "{seen}");
    assert_eq!(seen["events"][0]["token"].to_string(), token);
    // The same watch for root shows root's lock too.
    let (_, all) = curl(server.addr, Some(&root), everything, None);
    let names: Vec<&str> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["other/x", "other/x", "jobs/a"], "{all}");
    // A name ci may not read is refused outright, and nobody unnamed may watch.
    let (status, refused) = curl(server.addr, Some(&ci), "/v1/watch?name=other/x", None);
    assert_eq!(status, 403, "{refused}");
    let (status, refused) = curl(server.addr, None, "/v1/watch?name=jobs/a", None);
    assert_eq!(status, 401, "{refused}");
}

#[test]
fn only_an_admin_defines_or_deletes_a_semaphore() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    common::wait_for_newest_cluster_version(&endpoint);
    let (root, ci, _) = secured(&server);
    let define = ["semaphore", "define", "jobs/pool", "--permits", "2"];
    let refused = as_token(&endpoint, Some(&ci), &define);
    assert_eq!(refused.status.code(), Some(77), "{refused:?}");
    stdout(&as_token(&endpoint, Some(&root), &define));
    // ci may use it (lock on jobs/), not delete it.
    let used = ["run", "--semaphore", "jobs/pool", "--", "true"];
    stdout(&as_token(&endpoint, Some(&ci), &used));
    let delete = ["semaphore", "delete", "jobs/pool"];
    let refused = as_token(&endpoint, Some(&ci), &delete);
    assert_eq!(refused.status.code(), Some(77), "{refused:?}");
    stdout(&as_token(&endpoint, Some(&root), &delete));
}

/// Issue 58, part 4: a token made with `--ttl` is refused once that time
/// has passed, and a denied identity at its next call, on a connection
/// (and a watch) opened while they were still good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_that_end_are_refused_on_connections_opened_before() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let (root, ci, ops) = secured(&server);
    common::wait_for_newest_cluster_version(&endpoint);
    let admin = |args: &[&str]| stdout(&as_token(&endpoint, Some(&root), args));

    let made = admin(&["acl", "token", "create", "ci", "--ttl", "3s", "--json"]);
    let made: Value = serde_json::from_str(&made).unwrap();
    let expiring = made["token"].as_str().unwrap().to_owned();
    let expires_unix_ms = made["expires_unix_ms"].as_u64().unwrap();
    let listed = admin(&["acl", "show"]);
    assert!(
        listed.contains(&format!("{}  ci  20", made["token_id"].as_str().unwrap())),
        "an expiry date is listed: {listed}"
    );
    let connect = |token: String| {
        let endpoint = endpoint.clone();
        async move {
            let tls = deadbolt_client::TlsOptions::default();
            deadbolt_client::Client::connect_with_token([endpoint], &tls, Some(&token))
                .await
                .unwrap()
        }
    };
    let ci_until = connect(expiring).await;
    let ops_client = connect(ops.clone()).await;
    assert_eq!(ci_until.acl_whoami().await.unwrap().identity, "ci");
    assert_eq!(ops_client.acl_whoami().await.unwrap().identity, "ops");
    let options = deadbolt_client::WatchOptions {
        prefix: true,
        ..Default::default()
    };
    let mut watch = ci_until.watch("jobs/", options);
    acquire(&endpoint, &ci, "jobs/before");
    let seen = watch.next().await.unwrap().unwrap();
    assert_eq!(seen.name, "jobs/before");

    // Past the expiry, by the wall clock the server reads.
    let now_unix_ms = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.unwrap().as_millis() as u64
    };
    while now_unix_ms() <= expires_unix_ms {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let expired = ci_until.acl_whoami().await.unwrap_err();
    assert_eq!(
        expired.kind(),
        deadbolt_client::ErrorKind::Unauthenticated,
        "{expired}"
    );
    assert!(expired.to_string().contains("expired at"), "{expired}");
    // The open watch ends at its next event; the same identity's other
    // token still works.
    acquire(&endpoint, &ci, "jobs/after");
    let ended = watch.next().await.unwrap().unwrap_err();
    assert_eq!(
        ended.kind(),
        deadbolt_client::ErrorKind::Unauthenticated,
        "{ended}"
    );

    // Denied: refused on the connection it already has, whatever it
    // presents, until allowed again. Root cannot be denied.
    admin(&["acl", "deny", "ops"]);
    let denied = ops_client.acl_whoami().await.unwrap_err();
    assert_eq!(
        denied.kind(),
        deadbolt_client::ErrorKind::PermissionDenied,
        "{denied}"
    );
    assert!(
        denied.to_string().contains("`deadbolt acl allow ops`"),
        "{denied}"
    );
    let fresh = as_token(&endpoint, Some(&ops), &["acquire", "--lock", "jobs/c"]);
    assert_eq!(fresh.status.code(), Some(77), "{fresh:?}");
    assert!(admin(&["acl", "show"]).contains("DENIED\nops"));
    let root_denied = as_token(&endpoint, Some(&root), &["acl", "deny", "root"]);
    assert!(!root_denied.status.success(), "{root_denied:?}");
    assert!(
        stderr(&root_denied).contains("cannot be denied"),
        "{}",
        stderr(&root_denied)
    );
    admin(&["acl", "allow", "ops"]);
    assert_eq!(ops_client.acl_whoami().await.unwrap().identity, "ops");
}
