//! Fencing end to end, through the `deadbolt` binary: the fenced store and
//! token checks from the shell, `run --once`, and the pause demo.

mod common;

use common::{deadbolt, TestServer};
use std::process::Output;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_owned()
}

/// `deadbolt acquire` then `release`: returns the grant's token.
fn grant_and_release(endpoint: &str, lock: &str) -> String {
    let acquired = deadbolt(endpoint, &["acquire", "--lock", lock, "--ttl", "30s"]);
    assert!(acquired.status.success(), "{acquired:?}");
    let out = stdout(&acquired);
    let (session, token) = out.split_once(' ').unwrap();
    let released = deadbolt(
        endpoint,
        &[
            "release",
            "--lock",
            lock,
            "--session",
            session,
            "--token",
            token,
        ],
    );
    assert!(released.status.success(), "{released:?}");
    token.to_owned()
}

#[test]
fn the_store_refuses_stale_tokens_from_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let older = grant_and_release(&endpoint, "job");
    let newer = grant_and_release(&endpoint, "job");

    let put = deadbolt(
        &endpoint,
        &["store", "put", "counter", "41", "--token", &newer],
    );
    assert!(put.status.success(), "{put:?}");
    let get = deadbolt(&endpoint, &["store", "get", "counter"]);
    assert_eq!(stdout(&get), "41");

    // The older holder's write is refused, exit 76, and says stale.
    let stale = deadbolt(
        &endpoint,
        &["store", "put", "counter", "7", "--token", &older],
    );
    assert_eq!(stale.status.code(), Some(76));
    assert!(stderr(&stale).contains("stale fencing token"), "{stale:?}");
    assert_eq!(
        stdout(&deadbolt(&endpoint, &["store", "get", "counter"])),
        "41"
    );

    // --json gives value and fence; a fenced read with the older token is stale.
    let json = deadbolt(&endpoint, &["store", "get", "counter", "--json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["value"], "41");
    assert_eq!(value["fence"].to_string(), newer);
    let fenced = deadbolt(&endpoint, &["store", "get", "counter", "--token", &older]);
    assert_eq!(fenced.status.code(), Some(76), "{fenced:?}");

    // Oversized keys and values are refused with the limit named.
    let big_value = "v".repeat(64 * 1024 + 1);
    let too_big = deadbolt(
        &endpoint,
        &["store", "put", "big", &big_value, "--token", &newer],
    );
    assert_eq!(too_big.status.code(), Some(1));
    assert!(
        stderr(&too_big).contains("the limit is 65536"),
        "{}",
        stderr(&too_big)
    );
    let long_key = "k".repeat(513);
    let bad_key = deadbolt(
        &endpoint,
        &["store", "put", &long_key, "v", "--token", &newer],
    );
    assert_eq!(bad_key.status.code(), Some(1));
    assert!(
        stderr(&bad_key).contains("invalid store key"),
        "{}",
        stderr(&bad_key)
    );

    // Deleting keeps the fence: the older token cannot recreate the key.
    let delete = deadbolt(
        &endpoint,
        &["store", "delete", "counter", "--token", &newer],
    );
    assert!(delete.status.success(), "{delete:?}");
    let missing = deadbolt(&endpoint, &["store", "get", "counter"]);
    assert_eq!(missing.status.code(), Some(1));
    let recreate = deadbolt(
        &endpoint,
        &["store", "put", "counter", "1", "--token", &older],
    );
    assert_eq!(recreate.status.code(), Some(76));
}

#[test]
fn a_fenced_read_locks_out_an_older_read_modify_write() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let a = grant_and_release(&endpoint, "counter-lock");
    let put = deadbolt(&endpoint, &["store", "put", "n", "10", "--token", &a]);
    assert!(put.status.success());
    // A reads (fenced) and pauses; B, newer, reads (fenced) and writes.
    let read_a = deadbolt(&endpoint, &["store", "get", "n", "--token", &a]);
    assert_eq!(stdout(&read_a), "10");
    let b = grant_and_release(&endpoint, "counter-lock");
    let read_b = deadbolt(&endpoint, &["store", "get", "n", "--token", &b]);
    assert_eq!(stdout(&read_b), "10");
    // A's late write of its increment is refused: no lost update.
    let late = deadbolt(&endpoint, &["store", "put", "n", "11", "--token", &a]);
    assert_eq!(late.status.code(), Some(76));
    let write_b = deadbolt(&endpoint, &["store", "put", "n", "11", "--token", &b]);
    assert!(write_b.status.success());
}

#[test]
fn check_tells_the_current_grant_from_a_stale_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let acquired = deadbolt(&endpoint, &["acquire", "--lock", "db", "--ttl", "30s"]);
    let out = stdout(&acquired);
    let (_, token) = out.split_once(' ').unwrap();
    let current = deadbolt(&endpoint, &["check", "--lock", "db", "--token", token]);
    assert!(current.status.success(), "{current:?}");
    let stale = (token.parse::<u64>().unwrap() - 1).to_string();
    let old = deadbolt(&endpoint, &["check", "--lock", "db", "--token", &stale]);
    assert_eq!(old.status.code(), Some(76));
    assert!(stderr(&old).contains("stale"), "{old:?}");
}

#[test]
fn run_once_runs_a_job_once_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let runs = dir.path().join("runs");
    let job = format!("echo ran >> {}", runs.display());
    let run = |key: &str, command: &str| {
        deadbolt(
            &endpoint,
            &[
                "run",
                "--lock",
                "daily-report",
                "--once",
                key,
                "--",
                "sh",
                "-c",
                command,
            ],
        )
    };
    // A failing run does not mark the key: the next one runs again.
    let failed = run("report:2026-11-29", "exit 3");
    assert_eq!(failed.status.code(), Some(3));
    assert!(run("report:2026-11-29", &job).status.success());
    let skipped = run("report:2026-11-29", &job);
    assert!(skipped.status.success());
    assert!(stderr(&skipped).contains("already done"), "{skipped:?}");
    assert!(run("report:2026-11-30", &job).status.success());
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(ran.lines().count(), 2, "{ran}");
    let marker = deadbolt(&endpoint, &["store", "get", "report:2026-11-29"]);
    assert!(stdout(&marker).starts_with("done at "), "{marker:?}");
}

#[test]
fn the_pause_demo_shows_the_stale_write_win_then_lose() {
    let demo = std::process::Command::new(common::BIN)
        .args(["demo", "pause", "--ttl", "1s"])
        .output()
        .unwrap();
    let out = stdout(&demo);
    assert!(demo.status.success(), "{out}\n{}", stderr(&demo));
    let (unfenced, fenced) = out.split_once("== 2.").expect("two parts");
    assert!(
        unfenced.contains("[A] the storage answers: 200 OK"),
        "{out}"
    );
    assert!(unfenced.contains("Corrupted"), "{out}");
    assert!(
        fenced.contains("[A] the storage answers: 409 Conflict: stale fencing token"),
        "{out}"
    );
    assert!(fenced.contains("Intact"), "{out}");
}

/// Lock-delay: after a holder's session expires, nobody gets the lock for
/// the delay; after a clean release, the next holder gets it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_holds_an_expired_holders_lock_back_but_not_a_released_one() {
    use std::time::{Duration, Instant};
    const TTL: Duration = Duration::from_secs(1);
    const DELAY: Duration = Duration::from_secs(2);
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let client = server.client().await;

    // A clean release is not delayed.
    let (released, _) = client.open_session_raw(TTL).await.unwrap();
    let token = client
        .acquire_raw_delayed(&released, "delayed", false, None, DELAY)
        .await
        .unwrap();
    client
        .release_raw(&released, "delayed", token)
        .await
        .unwrap();
    assert!(client.lock_status("delayed").await.unwrap().is_none());

    // A holder that dies (never renews): the lock waits TTL, then DELAY.
    let opened = Instant::now();
    let (dead, _) = client.open_session_raw(TTL).await.unwrap();
    let dead_token = client
        .acquire_raw_delayed(&dead, "delayed", false, None, DELAY)
        .await
        .unwrap();
    let waiter = client.open_session(Duration::from_secs(30)).await.unwrap();
    let granted = tokio::spawn(async move {
        let guard = waiter.lock("delayed").await.unwrap();
        (guard.token(), Instant::now())
    });
    tokio::time::sleep(TTL + DELAY / 2).await;
    let state = client
        .lock_status("delayed")
        .await
        .unwrap()
        .expect("still unavailable");
    assert!(state.lock_delay, "{state:?}");
    assert_eq!(state.token, dead_token);
    let status = deadbolt(&server.endpoint(), &["status", "--lock", "delayed"]);
    assert!(stdout(&status).contains("lock-delay"), "{status:?}");
    let busy = deadbolt(
        &server.endpoint(),
        &["acquire", "--lock", "delayed", "--no-wait"],
    );
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    assert!(
        String::from_utf8_lossy(&busy.stderr).contains("is in lock-delay"),
        "{busy:?}"
    );

    let (token, at) = granted.await.unwrap();
    assert!(token > dead_token);
    let waited = at - opened;
    assert!(
        waited >= TTL + DELAY,
        "granted {waited:?} after the dead holder's open"
    );
}

/// The read-modify-write snippet of docs/fencing.md, as written there.
#[test]
fn the_documented_counter_snippet_counts() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/fencing.md"
    ))
    .unwrap();
    let script = doc
        .split("deadbolt run --lock billing -- sh -ec '")
        .nth(1)
        .and_then(|rest| rest.split("\n'").next())
        .expect("the snippet is in docs/fencing.md");
    let bin_dir = std::path::Path::new(common::BIN).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    for _ in 0..3 {
        let run = std::process::Command::new(common::BIN)
            .args(["run", "--lock", "billing", "--", "sh", "-ec", script])
            .env("DEADBOLT_ENDPOINT", server.endpoint())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(run.status.success(), "{run:?}");
    }
    let get = deadbolt(&server.endpoint(), &["store", "get", "invoices-sent"]);
    assert_eq!(stdout(&get), "3");
}
