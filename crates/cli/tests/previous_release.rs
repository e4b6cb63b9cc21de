//! What earlier releases left on disk still opens: every release's fixture
//! in `testdata/<release>/` (made by `scripts/make-fixture.sh` with that
//! release's binary when it was tagged) is opened by this build on every
//! test run, as an operator upgrading would: `deadbolt data check`, then a
//! server on the data directory, then a restore of the backup.
//!
//! Why on every run: a change to the data format, the backup format or the
//! table's encoding that forgets a migration fails here, not in a user's
//! upgrade (docs/upgrading.md).

mod common;

use common::{deadbolt, free_port, TestServer, BIN};
use deadbolt_client::{Client, TlsOptions};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every release's fixture directory.
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|err| panic!("{}: {err}", root.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("expected.json").exists())
        .collect();
    found.sort();
    assert!(
        !found.is_empty(),
        "no release fixture in {}",
        root.display()
    );
    found
}

fn expected(fixture: &Path) -> Value {
    let text = std::fs::read_to_string(fixture.join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("not JSON: {out:?}"))
}

/// Checks that the node at `server` holds what the fixture says, and that
/// it goes on granting with tokens above every one the fixture issued.
async fn holds_the_fixture(server: &TestServer, expected: &Value) {
    let root = expected["root_token"].as_str().unwrap();
    let client =
        Client::connect_with_token([server.endpoint()], &TlsOptions::default(), Some(root))
            .await
            .unwrap();
    let release = expected["release"].as_str().unwrap();
    for (lock, token) in expected["tokens"].as_object().unwrap() {
        let status = client.lock_status(lock).await.unwrap();
        let status = status.unwrap_or_else(|| panic!("{release}: {lock} is free"));
        assert_eq!(status.token, token.as_u64().unwrap(), "{release}: {lock}");
    }
    for (key, value) in expected["store"].as_object().unwrap() {
        let stored = client.store_get(key, None).await.unwrap();
        assert_eq!(stored.value.as_deref(), value.as_str(), "{release}: {key}");
    }
    // The rules came along: the worker's token is still its identity.
    let worker = expected["worker_token"].as_str().unwrap();
    let as_worker =
        Client::connect_with_token([server.endpoint()], &TlsOptions::default(), Some(worker))
            .await
            .unwrap();
    let me = as_worker.acl_whoami().await.unwrap();
    assert_eq!(me.identity, "fixture-worker", "{release}: {me:?}");

    let primitives = &expected["primitives"];
    if !primitives.is_null() {
        holds_the_primitives(&client, release, primitives).await;
    }

    let highest = expected["tokens"]
        .as_object()
        .unwrap()
        .values()
        .chain([&primitives["election"]["term"]])
        .chain(primitives["rw"]["readers"].as_array().into_iter().flatten())
        .chain(
            primitives["semaphore"]["permits"]
                .as_array()
                .into_iter()
                .flatten(),
        )
        .filter_map(Value::as_u64)
        .max()
        .unwrap();
    let session = client
        .open_session(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let guard = session.lock("fixture/new").await.unwrap();
    assert!(
        guard.token() > highest,
        "{release}: token {} after {highest}",
        guard.token()
    );
}

/// The read/write lock, semaphore and election of a fixture made from
/// 0.2.0 on: the same holders with the same tokens (and slots), and the
/// same queues.
async fn holds_the_primitives(client: &Client, release: &str, expected: &Value) {
    let tokens = |value: &Value| -> Vec<u64> {
        let listed = value.as_array().unwrap().iter();
        listed.map(|token| token.as_u64().unwrap()).collect()
    };
    let rw = &expected["rw"];
    let lock = rw["lock"].as_str().unwrap();
    let state = client.lock_status(lock).await.unwrap();
    let state = state.unwrap_or_else(|| panic!("{release}: {lock} is free"));
    let readers: Vec<u64> = state.holders.iter().map(|hold| hold.token).collect();
    assert_eq!(
        (state.mode.as_str(), readers),
        ("shared", tokens(&rw["readers"])),
        "{release}: {state:?}"
    );
    let writers = state.waiters.iter().filter(|w| w.mode == "exclusive");
    assert_eq!(
        writers.count() as u64,
        rw["writers_queued"].as_u64().unwrap(),
        "{release}: {state:?}"
    );

    let semaphore = &expected["semaphore"];
    let name = semaphore["name"].as_str().unwrap();
    let state = client.semaphore_status(name).await.unwrap();
    let state = state.unwrap_or_else(|| panic!("{release}: {name} is gone"));
    let permits = state.holders.iter().flat_map(|holder| &holder.permits);
    let (held, slots): (Vec<u64>, Vec<u32>) = permits.map(|p| (p.token, p.slot)).unzip();
    assert_eq!(held, tokens(&semaphore["permits"]), "{release}: {state:?}");
    assert_eq!(slots, [0, 1], "{release}: {state:?}");
    assert_eq!(
        (state.capacity, state.defined),
        (semaphore["capacity"].as_u64().unwrap() as u32, true),
        "{release}: {state:?}"
    );

    let election = &expected["election"];
    let name = election["name"].as_str().unwrap();
    let led = client.leader(name).await.unwrap();
    let leader = led.leader.clone();
    let leader = leader.unwrap_or_else(|| panic!("{release}: {name} has no leader"));
    assert_eq!(
        (leader.term, leader.value.as_str()),
        (
            election["term"].as_u64().unwrap(),
            election["value"].as_str().unwrap()
        ),
        "{release}: {led:?}"
    );
    assert_eq!(
        led.candidate_session_ids.len() as u64,
        election["candidates"].as_u64().unwrap(),
        "{release}: {led:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_earlier_releases_data_directory_opens_and_holds_what_it_held() {
    for fixture in fixtures() {
        let expected = expected(&fixture);
        let dir = tempfile::tempdir().unwrap();
        let unpacked = Command::new("tar")
            .arg("xzf")
            .arg(fixture.join("data.tgz"))
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(unpacked.success());
        let data = dir.path().join("data");

        // Checked as it is, without changing it: the report it had.
        let check = json(&deadbolt(
            "",
            &[
                "data",
                "check",
                "--json",
                "--data-dir",
                data.to_str().unwrap(),
            ],
        ));
        // A later release may report more (the cluster version, 0.2.0 on:
        // 1 for a directory from before it existed); what it reported then
        // is unchanged.
        let reported = &check["report"];
        for (field, value) in expected["data_check"]["report"].as_object().unwrap() {
            assert_eq!(&reported[field], value, "{}: {field}", fixture.display());
        }
        assert_eq!(check["intact"], true, "{check}");
        if expected["data_check"]["report"]
            .get("cluster_version")
            .is_none()
        {
            assert_eq!(reported["cluster_version"], 1, "{check}");
        }

        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let server = tokio::task::spawn_blocking(move || TestServer::start_on(&data, addr))
            .await
            .unwrap();
        holds_the_fixture(&server, &expected).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_earlier_releases_backup_inspects_and_restores() {
    for fixture in fixtures() {
        let expected = expected(&fixture);
        let backup = fixture.join("backup.snap");
        let inspected = json(&deadbolt(
            "",
            &["snapshot", "inspect", backup.to_str().unwrap(), "--json"],
        ));
        assert_eq!(inspected, expected["backup"], "{}", fixture.display());

        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("restored");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let restored = Command::new(BIN)
            .args([
                "snapshot",
                "restore",
                backup.to_str().unwrap(),
                "--data-dir",
            ])
            .arg(&data)
            .args(["--listen", &addr.to_string()])
            .output()
            .unwrap();
        assert!(restored.status.success(), "{restored:?}");
        let server = tokio::task::spawn_blocking(move || TestServer::start_on(&data, addr))
            .await
            .unwrap();
        holds_the_fixture(&server, &expected).await;
    }
}
