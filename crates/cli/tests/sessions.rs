//! A session is a capability: what `status`, `locks` and `history` show to
//! everyone (session ids and tokens) is not enough to act on somebody
//! else's session. Tried as a stranger would, with `curl` and the CLI,
//! against a real server and a real `deadbolt run`.

mod common;

use common::{curl, deadbolt, signal, TestServer, BIN};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Holder session id and token of `lock`, as `deadbolt status --json`
/// shows them to anyone; `None` while it is free.
fn holder(endpoint: &str, lock: &str) -> Option<(u64, u64)> {
    let output = deadbolt(endpoint, &["status", "--lock", lock, "--json"]);
    assert!(output.status.success(), "{output:?}");
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    let state = status["state"].as_object()?;
    Some((
        state["holder_session_id"].as_u64().unwrap(),
        state["token"].as_u64().unwrap(),
    ))
}

#[test]
fn a_session_id_and_token_from_status_cannot_release_anothers_lock() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let (renewed, handle) = (dir.path().join("renewed"), dir.path().join("handle"));

    // A cron job holds the lock. Its command renews its own session with
    // the handle `deadbolt run` gives it, then works for a while.
    let mut run = Command::new(BIN)
        .args(["run", "--lock", "nightly", "--ttl", "30s", "--", "sh", "-c"])
        .arg(concat!(
            r#"echo "$DEADBOLT_SESSION" >"$HANDLE"; "#,
            r#""$DEADBOLT_BIN" keepalive --session "$DEADBOLT_SESSION" >"$RENEWED" 2>&1; "#,
            "exec sleep 60"
        ))
        .env("DEADBOLT_ENDPOINT", &endpoint)
        .env("DEADBOLT_BIN", BIN)
        .env("RENEWED", &renewed)
        .env("HANDLE", &handle)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let (session, token) = loop {
        if let Some(held) = holder(&endpoint, "nightly") {
            break held;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never held");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (status, shown) = curl(server.addr, None, "/v1/lock/status?lock=nightly", None);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["state"]["holder_session_id"], session);
    assert_eq!(shown["state"]["token"], token);
    assert!(
        !shown.to_string().contains("secret"),
        "status shows a secret: {shown}"
    );

    // With what status showed, and no secret, an empty one or a made-up
    // one, every call on the session is refused: 403, permission_denied.
    let secrets = [None, Some(""), Some("0123456789abcdef0123456789abcdef")];
    for secret in secrets {
        let with_secret = |mut body: Value| {
            body["session_id"] = session.into();
            if let Some(secret) = secret {
                body["session_secret"] = secret.into();
            }
            body
        };
        for (path, body) in [
            (
                "/v1/lock/release",
                json!({"lock": "nightly", "token": token}),
            ),
            ("/v1/session/keepalive", json!({})),
            ("/v1/session/close", json!({})),
            ("/v1/lock/acquire", json!({"lock": "squatted"})),
        ] {
            let (status, reply) = curl(server.addr, None, path, Some(&with_secret(body)));
            assert_eq!(status, 403, "{path} with secret {secret:?}: {reply}");
            assert_eq!(reply["error"]["kind"], "permission_denied", "{reply}");
            let message = reply["error"]["message"].as_str().unwrap();
            let why = match secret {
                Some(secret) if !secret.is_empty() => "belongs to another client",
                _ => "needs its secret",
            };
            assert!(
                message.contains(&format!("session {session} {why}")),
                "{message}"
            );
            assert!(message.contains("only the client that opened"), "{message}");
        }
    }

    // The CLI: a bare id is not a session handle; a made-up secret is
    // refused by the server.
    let (session, token) = (session.to_string(), token.to_string());
    let release = |handle: &str| {
        deadbolt(
            &endpoint,
            &[
                "release",
                "--lock",
                "nightly",
                "--session",
                handle,
                "--token",
                &token,
            ],
        )
    };
    let bare = release(&session);
    assert_eq!(bare.status.code(), Some(2), "{bare:?}");
    let said = String::from_utf8_lossy(&bare.stderr);
    assert!(
        said.contains("without its secret") && said.contains("ID.SECRET"),
        "{said}"
    );
    let forged = format!("{session}.0123456789abcdef0123456789abcdef");
    let refused = release(&forged);
    assert_eq!(refused.status.code(), Some(77), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("belongs to another client"), "{said}");
    let renew = deadbolt(&endpoint, &["keepalive", "--session", &forged]);
    assert_eq!(renew.status.code(), Some(77), "{renew:?}");

    // Nothing changed: the same grant holds the lock, the job still runs,
    // no lock was taken in its session, and the trail shows one grant.
    let token: u64 = token.parse().unwrap();
    let session: u64 = session.parse().unwrap();
    assert_eq!(holder(&endpoint, "nightly"), Some((session, token)));
    assert_eq!(holder(&endpoint, "squatted"), None);
    assert!(run.try_wait().unwrap().is_none(), "deadbolt run exited");
    let (_, history) = curl(server.addr, None, "/v1/lock/history?lock=nightly", None);
    let entries = history["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{history}");
    assert_eq!(entries[0]["what"], "granted");

    // The owner's own command could act on its session: it was given the
    // session's handle, ID.SECRET.
    let started = Instant::now();
    loop {
        let own = std::fs::read_to_string(&renewed).unwrap_or_default();
        if own.starts_with("renewed for") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{own:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let handle = std::fs::read_to_string(&handle).unwrap().trim().to_owned();
    let (id, secret) = handle.split_once('.').expect("ID.SECRET");
    assert_eq!(id, session.to_string());
    assert_eq!(secret.len(), 32, "{handle}");
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()), "{handle}");

    signal(run.id() as i32, libc::SIGTERM);
    let status = run.wait().unwrap();
    assert_ne!(status.code(), Some(76), "the lock was lost: {status}");
    assert_eq!(
        holder(&endpoint, "nightly"),
        None,
        "released on the way out"
    );
    // The session ended with the run: even its own handle finds nothing now.
    let late = deadbolt(&endpoint, &["keepalive", "--session", &handle]);
    assert_eq!(late.status.code(), Some(76), "{late:?}");
    assert!(String::from_utf8_lossy(&late.stderr).contains("unknown session"));
}
