//! Bad input of every kind gets a clear error, changes nothing, and leaves
//! the server serving everyone else.

mod common;

use common::{http, post, TestServer, BIN};
use deadbolt_client::ErrorKind;
use serde_json::json;
use std::process::Command;
use std::time::Duration;

fn error_kind(body: &serde_json::Value) -> &str {
    body["error"]["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("no error kind in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_refuses_bad_requests_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let addr = server.addr;

    let (status, body) = http(
        addr,
        "POST",
        "/v1/lock/acquire",
        Some(b"{\"session_id\": 1, \"lock\":"),
    )
    .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("invalid_argument") && body.contains("JSON"),
        "{body}"
    );

    let (status, body) = post(
        addr,
        "/v1/lock/acquire",
        json!({"session_id": "one", "lock": "x"}),
    );
    assert_eq!(
        (status, error_kind(&body)),
        (400, "invalid_argument"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session_id"),
        "{body}"
    );

    for ttl_ms in [0u64, 10 * 365 * 24 * 3600 * 1000] {
        let (status, body) = post(addr, "/v1/session/open", json!({ "ttl_ms": ttl_ms }));
        assert_eq!(
            (status, error_kind(&body)),
            (400, "invalid_argument"),
            "{body}"
        );
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out of range"));
    }

    let (status, body) = post(
        addr,
        "/v1/lock/acquire",
        json!({"session_id": 4242, "lock": "x"}),
    );
    assert_eq!(
        (status, error_kind(&body)),
        (404, "unknown_session"),
        "{body}"
    );
    let (status, body) = post(addr, "/v1/session/keepalive", json!({"session_id": 4242}));
    assert_eq!(
        (status, error_kind(&body)),
        (404, "unknown_session"),
        "{body}"
    );

    let (_, opened) = post(addr, "/v1/session/open", json!({"ttl_ms": 10_000}));
    let session = opened["session_id"].as_u64().unwrap();
    let (_, other) = post(addr, "/v1/session/open", json!({"ttl_ms": 10_000}));
    let other = other["session_id"].as_u64().unwrap();
    let (status, granted) = post(
        addr,
        "/v1/lock/acquire",
        json!({"session_id": session, "lock": "x"}),
    );
    assert_eq!(status, 200, "{granted}");
    let token = granted["token"].as_u64().unwrap();

    let (status, body) = post(
        addr,
        "/v1/lock/release",
        json!({"session_id": session, "lock": "x", "token": token + 1}),
    );
    assert_eq!((status, error_kind(&body)), (409, "stale_token"), "{body}");
    let (status, body) = post(
        addr,
        "/v1/lock/release",
        json!({"session_id": other, "lock": "x", "token": token}),
    );
    assert_eq!((status, error_kind(&body)), (409, "not_holder"), "{body}");
    let (status, body) = post(
        addr,
        "/v1/lock/acquire",
        json!({"session_id": other, "lock": "x"}),
    );
    assert_eq!((status, error_kind(&body)), (423, "busy"), "{body}");

    let (status, body) = post(
        addr,
        "/v1/lock/acquire",
        json!({"session_id": session, "lock": ""}),
    );
    assert_eq!(
        (status, error_kind(&body)),
        (400, "invalid_argument"),
        "{body}"
    );
    let long = "n".repeat(1000);
    let (status, body) = post(
        addr,
        "/v1/lock/acquire",
        json!({"session_id": session, "lock": long}),
    );
    assert_eq!(
        (status, error_kind(&body)),
        (400, "invalid_argument"),
        "{body}"
    );
    let huge = json!({"session_id": session, "lock": "n".repeat(10 * 1024 * 1024)}).to_string();
    let (status, _) = http(addr, "POST", "/v1/lock/acquire", Some(huge.as_bytes())).unwrap();
    assert_eq!(status, 413);

    // None of that disturbed the lock or the service.
    let (status, body) = http(addr, "GET", "/v1/lock/status?lock=x", None).unwrap();
    assert_eq!(status, 200);
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["state"]["token"].as_u64(), Some(token));
    let (status, _) = post(
        addr,
        "/v1/lock/release",
        json!({"session_id": session, "lock": "x", "token": token}),
    );
    assert_eq!(status, 200);
    let (status, granted) = post(
        addr,
        "/v1/lock/acquire",
        json!({"session_id": other, "lock": "x"}),
    );
    assert_eq!(status, 200);
    assert!(granted["token"].as_u64().unwrap() > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_api_refuses_bad_requests_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let client = server.client().await;

    for ttl in [Duration::ZERO, Duration::from_secs(10 * 365 * 24 * 3600)] {
        let err = client.open_session_raw(ttl).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
    let err = client.acquire_raw(777, "x", false, None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnknownSession);
    assert!(err.to_string().contains("unknown session 777"), "{err}");

    let (session, _) = client
        .open_session_raw(Duration::from_secs(10))
        .await
        .unwrap();
    let huge = "n".repeat(10 * 1024 * 1024);
    let err = client
        .acquire_raw(session, &huge, false, None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let token = client.acquire_raw(session, "x", false, None).await.unwrap();
    let err = client
        .release_raw(session, "x", token - 1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleToken);
    assert!(err.to_string().contains("stale token"), "{err}");
    client.release_raw(session, "x", token).await.unwrap();
    let err = client.release_raw(session, "x", token).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHolder);
}

fn start_server_expecting_failure(data_dir: &std::path::Path) -> String {
    let output = Command::new(BIN)
        .args([
            "server",
            "--listen",
            &format!("127.0.0.1:{}", common::free_port()),
            "--data-dir",
        ])
        .arg(data_dir)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn foreign_or_corrupt_data_directory_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("postgres");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("PG_VERSION"), "15\n").unwrap();
    let message = start_server_expecting_failure(&foreign);
    assert!(
        message.contains("not a Deadbolt data directory"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(foreign.join("PG_VERSION")).unwrap(),
        "15\n"
    );

    let corrupt = dir.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::write(corrupt.join("deadbolt.redb"), vec![0xa5; 100_000]).unwrap();
    let message = start_server_expecting_failure(&corrupt);
    assert!(message.contains("unreadable"), "{message}");
    assert_eq!(
        std::fs::read(corrupt.join("deadbolt.redb")).unwrap(),
        vec![0xa5; 100_000]
    );
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start(&dir.path().join("data"));
    let status = server.terminate();
    assert!(status.success(), "{status}");
    assert!(
        server.log_text().contains("stopped"),
        "{}",
        server.log_text()
    );
}
