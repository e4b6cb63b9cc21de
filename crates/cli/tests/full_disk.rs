//! A full disk is an error, not an outage (issue 58 §2).
//!
//! Before, the first log append that met a full disk stopped Raft and the
//! process with it: a single node was down until someone freed space and
//! restarted it. Now the write waits for space, new writes are refused at
//! once with `unavailable: disk full`, status and metrics still answer,
//! and the node resumes by itself when space is back, with everything it
//! acknowledged.
//!
//! The disk is real; testkit's `fulldisk` library (`LD_PRELOAD`) fails every
//! write under the data directory with ENOSPC while a trigger file exists,
//! as a full file system does. (The 3-node case, where a leader with a
//! full disk gives way to one with space, is in `cluster.rs`.)

mod common;

use common::{free_port, http, metric, post, TestServer};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn wait_for_disk_full(addr: SocketAddr, full: f64, server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(addr, "deadbolt_disk_full") != full {
        assert!(
            Instant::now() < deadline,
            "deadbolt_disk_full never became {full}: {}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A lock's token as `/v1/lock/status` reports it.
fn holder_token(addr: SocketAddr, lock: &str) -> Option<u64> {
    let (status, body) = http(addr, "GET", &format!("/v1/lock/status?lock={lock}"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    body["state"]["token"].as_u64()
}

/// `disk_full` as `/v1/cluster/status` reports it.
fn disk_full_in_status(addr: SocketAddr) -> Option<bool> {
    let (status, body) = http(addr, "GET", "/v1/cluster/status", None).unwrap();
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    body["disk_full"].as_bool()
}

/// On one thread (the default: the log's appends run on the thread that
/// serves, which must not block on the full disk) and on several (appends
/// on the blocking pool).
#[test]
fn a_full_disk_refuses_writes_and_the_node_resumes_when_space_is_back() {
    for threads in ["1", "2"] {
        fills_and_resumes(&["--threads", threads]);
    }
}

fn fills_and_resumes(flags: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let library = deadbolt_testkit::fulldisk_library(dir.path());
    let trigger = dir.path().join("disk-full");
    let data = dir.path().join("data");
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let env = [
        ("LD_PRELOAD", library.as_path()),
        ("FULLDISK_TRIGGER", trigger.as_path()),
    ];
    let mut server = TestServer::try_start_with_flags_and_env(&data, addr, flags, &env).unwrap();
    let (_, session) = post(addr, "/v1/session/open", json!({"ttl_ms": 120_000}));
    let acquire = move |lock: &str| {
        let mut body = json!({"lock": lock});
        body["session_id"] = session["session_id"].clone();
        body["session_secret"] = session["session_secret"].clone();
        post(addr, "/v1/lock/acquire", body)
    };
    let (status, granted) = acquire("before");
    assert_eq!(status, 200, "{granted}");
    let before = granted["token"].as_u64().unwrap();
    assert_eq!(metric(addr, "deadbolt_disk_full"), 0.0);

    std::fs::write(&trigger, format!("{}/\n", data.display())).unwrap();
    // The library looks at its trigger every few milliseconds.
    std::thread::sleep(Duration::from_millis(100));
    // The first write to meet the full disk waits for space.
    let meets_it = std::thread::spawn({
        let acquire = acquire.clone();
        move || acquire("during")
    });
    wait_for_disk_full(addr, 1.0, &server);

    // New writes are refused at once, in words an operator acts on.
    let (status, refused) = acquire("refused");
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["error"]["kind"], "unavailable", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("disk full:"), "{message}");
    // What needs no write still answers: status (which says why this node
    // takes no writes), readiness, metrics.
    assert_eq!(disk_full_in_status(addr), Some(true));
    let log = server.log_text();
    assert!(
        log.contains("the disk is full") && log.contains("No space left on device"),
        "{log}"
    );

    // Space comes back: the node resumes by itself, no restart.
    std::fs::remove_file(&trigger).unwrap();
    wait_for_disk_full(addr, 0.0, &server);
    assert!(server.exit_within(Duration::ZERO).is_none(), "it stopped");
    assert!(server.log_text().contains("space is back"));
    assert_ne!(disk_full_in_status(addr), Some(true));
    // The write that waited was committed once space was back, or (on a
    // machine slower than its commit deadline) answered `unavailable`
    // with nothing acknowledged: never anything else.
    let (status, during) = meets_it.join().unwrap();
    let during = match status {
        200 => during["token"].as_u64(),
        _ => {
            assert_eq!(
                (status, &during["error"]["kind"]),
                (503, &json!("unavailable")),
                "{during}"
            );
            None
        }
    };
    let (status, granted) = acquire("after");
    assert_eq!(status, 200, "{granted}");
    let after = granted["token"].as_u64().unwrap();
    assert!(after > before.max(during.unwrap_or(0)));

    // Everything acknowledged is on the disk: a restart without the
    // library finds it.
    server.kill9();
    let server = TestServer::start_on(&data, addr);
    assert_eq!(holder_token(addr, "before"), Some(before));
    assert_eq!(holder_token(addr, "after"), Some(after));
    if let Some(during) = during {
        assert_eq!(holder_token(addr, "during"), Some(during));
    }
    drop(server);
}
