//! `deadbolt run`, `acquire`, `status`: the CLI as a cron wrapper would use it.

mod common;

use common::{deadbolt, signal, TestServer, BIN};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `pid` is still running (zombies count as gone).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.split(' ').nth(2).is_none_or(|state| state != "Z"))
        .unwrap_or(false)
}

/// Waits a little for a killed process to disappear.
fn gone_soon(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Waits until the command under test has written a pid to `path`.
async fn read_pid(path: &std::path::Path) -> i32 {
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn each_run_sees_a_larger_token_and_its_exit_code_passes_through() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let print = [
        "run",
        "--lock",
        "report",
        "--",
        "sh",
        "-c",
        "echo $DEADBOLT_LOCK $DEADBOLT_TOKEN",
    ];
    let first = deadbolt(&endpoint, &print);
    let second = deadbolt(&endpoint, &print);
    assert!(first.status.success() && second.status.success());
    let token = |out: &std::process::Output| -> u64 {
        let text = stdout(out);
        let (lock, token) = text.split_once(' ').unwrap();
        assert_eq!(lock, "report");
        token.parse().unwrap()
    };
    assert!(
        token(&second) > token(&first),
        "{} then {}",
        token(&first),
        token(&second)
    );

    let failing = deadbolt(
        &endpoint,
        &["run", "--lock", "report", "--", "sh", "-c", "exit 7"],
    );
    assert_eq!(failing.status.code(), Some(7));
    // Released after each run: nobody holds it now.
    let status = deadbolt(&endpoint, &["status", "--lock", "report"]);
    assert_eq!(stdout(&status), "report: free");
}

#[test]
fn no_wait_on_a_held_lock_exits_busy_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let acquired = deadbolt(
        &endpoint,
        &["acquire", "--lock", "db-migration", "--ttl", "20s"],
    );
    assert!(acquired.status.success(), "{acquired:?}");

    let busy = deadbolt(
        &endpoint,
        &["run", "--lock", "db-migration", "--no-wait", "--", "true"],
    );
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    assert!(String::from_utf8_lossy(&busy.stderr).contains("busy"));

    let timed_out = deadbolt(
        &endpoint,
        &[
            "run",
            "--lock",
            "db-migration",
            "--wait",
            "300ms",
            "--",
            "true",
        ],
    );
    assert_eq!(timed_out.status.code(), Some(75), "{timed_out:?}");

    // `release` with the printed session and token frees it for the next run.
    let printed = stdout(&acquired);
    let (session, token) = printed.split_once(' ').unwrap();
    let released = deadbolt(
        &endpoint,
        &[
            "release",
            "--lock",
            "db-migration",
            "--session",
            session,
            "--token",
            token,
        ],
    );
    assert!(released.status.success(), "{released:?}");
    let ran = deadbolt(
        &endpoint,
        &["run", "--lock", "db-migration", "--no-wait", "--", "true"],
    );
    assert_eq!(ran.status.code(), Some(0));
}

#[test]
fn unreachable_server_has_its_own_exit_code() {
    let port = common::free_port();
    let output = deadbolt(
        &format!("http://127.0.0.1:{port}"),
        &["run", "--lock", "x", "--", "true"],
    );
    assert_eq!(output.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&output.stderr).contains("could not reach"));
}

/// A holder killed with SIGKILL never releases: the lock passes only when
/// its lease runs out, to a waiter, with a larger token. Its command dies
/// with it (it must not run on unguarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_loses_the_lock_after_its_ttl_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let ttl = Duration::from_secs(2);
    let marker = dir.path().join("child.pid");
    let mut holder = Command::new(BIN)
        .args(["run", "--lock", "nightly", "--ttl", "2s", "--", "sh", "-c"])
        // The pid recorded is a grandchild of `deadbolt run`: a background job.
        .arg(format!("sleep 60 & echo $! > {}; wait", marker.display()))
        .env("DEADBOLT_ENDPOINT", server.endpoint())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let client = server.client().await;
    let child_pid = read_pid(&marker).await;
    let held = client.lock_status("nightly").await.unwrap().expect("held");
    // Give the holder's watchdog time to renew at least once, so the test
    // exercises a renewed lease, not only the first one.
    tokio::time::sleep(ttl / 2).await;

    holder.kill().unwrap(); // SIGKILL
    let killed_at = Instant::now();
    holder.wait().unwrap();

    let waiter = client.open_session(Duration::from_secs(10)).await.unwrap();
    let guard = waiter.lock("nightly").await.unwrap();
    let handed_over = killed_at.elapsed();
    assert!(
        guard.token() > held.token,
        "{} after {}",
        guard.token(),
        held.token
    );
    // The last renewal was sent at most ttl/3 before the kill, so the lease
    // cannot have ended sooner than 2/3 of the TTL after it.
    assert!(
        handed_over >= ttl * 2 / 3,
        "lock passed on after only {handed_over:?}"
    );
    assert!(
        gone_soon(child_pid),
        "the command's background job outlived its killed `deadbolt run`"
    );
    guard.release().await.unwrap();
}

/// `deadbolt run` stops its command itself, before the server could expire
/// the lease, when keepalives stop getting through (the server is frozen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_is_killed_before_the_lease_can_end_when_renewal_fails() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let ttl = Duration::from_secs(2);
    let marker = dir.path().join("child.pid");
    let runner = Command::new(BIN)
        .args(["run", "--lock", "frozen", "--ttl", "2s", "--", "sh", "-c"])
        // A background job that ignores SIGTERM: only SIGKILL stops it.
        .arg(format!(
            "(trap '' TERM; exec sleep 60) & echo $! > {}; wait",
            marker.display()
        ))
        .env("DEADBOLT_ENDPOINT", server.endpoint())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child_pid = read_pid(&marker).await;
    signal(server.pid(), libc::SIGSTOP);
    let frozen_at = Instant::now();
    while alive(child_pid) {
        assert!(
            frozen_at.elapsed() < ttl * 3,
            "the command was never stopped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped_after = frozen_at.elapsed();
    let output = tokio::task::spawn_blocking(move || runner.wait_with_output().unwrap())
        .await
        .unwrap();
    signal(server.pid(), libc::SIGCONT);
    assert_eq!(output.status.code(), Some(76), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("lost while running"));
    // The server was frozen after the last renewal was sent, so that
    // renewal's lease (the one the server would enforce) ends within one TTL
    // of the freeze: the command had to be dead by then.
    assert!(
        stopped_after < ttl,
        "command stopped {stopped_after:?} after the freeze"
    );
}

/// Runs `script` (which writes a background job's pid to `$MARKER`) under
/// `deadbolt run` to completion, and returns that job's pid.
fn run_leaving_a_job(lock: &str, script: &str) -> i32 {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let marker = dir.path().join("job.pid");
    let script = script.replace("$MARKER", &marker.display().to_string());
    let output = deadbolt(
        &server.endpoint(),
        &["run", "--lock", lock, "--", "sh", "-c", &script],
    );
    assert!(output.status.success(), "{output:?}");
    std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn background_jobs_do_not_outlive_the_lock() {
    let job = run_leaving_a_job("leaky", "sleep 60 & echo $! > $MARKER");
    assert!(
        gone_soon(job),
        "a background job kept running after the lock was released"
    );
}

#[test]
fn a_job_that_leaves_the_process_group_still_dies_before_the_release() {
    // `setsid` moves the job into a session (and group) of its own, out of
    // reach of a process-group kill.
    let job = run_leaving_a_job(
        "escape",
        "setsid sleep 60 >/dev/null 2>&1 </dev/null & echo $! > $MARKER; sleep 0.3",
    );
    // No waiting: by the time `deadbolt run` has exited, it must be gone.
    assert!(!alive(job), "a job that called setsid outlived the lock");
}

/// SIGTERM to `deadbolt run` reaches the command; one that ignores it is
/// killed `--grace` later, and only then is the lock released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let marker = dir.path().join("command.pid");
    let grace = Duration::from_millis(500);
    let runner = Command::new(BIN)
        .args(["run", "--lock", "stubborn", "--grace", "500ms", "--"])
        .args(["sh", "-c"])
        .arg(format!(
            "trap '' TERM; echo $$ > {}; sleep 30",
            marker.display()
        ))
        .env("DEADBOLT_ENDPOINT", server.endpoint())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let command_pid = read_pid(&marker).await;
    signal(runner.id() as i32, libc::SIGTERM);
    let told_at = Instant::now();
    let output = tokio::task::spawn_blocking(move || runner.wait_with_output().unwrap())
        .await
        .unwrap();
    let stopped_after = told_at.elapsed();
    assert!(!alive(command_pid), "the command outlived `deadbolt run`");
    assert_eq!(
        output.status.code(),
        Some(128 + libc::SIGKILL),
        "{output:?}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("still running 500ms after"), "{stderr}");
    assert!(
        stopped_after >= grace,
        "killed after only {stopped_after:?}"
    );
    // Released, not left to expire: free at once.
    let status = deadbolt(&server.endpoint(), &["status", "--lock", "stubborn"]);
    assert!(stdout(&status).contains("free"), "{status:?}");
}

#[test]
fn a_command_that_cannot_start_exits_as_a_shell_would() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let missing = deadbolt(
        &server.endpoint(),
        &["run", "--lock", "start", "--", "/nonexistent/command"],
    );
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    let not_executable = dir.path().join("data-file");
    std::fs::write(&not_executable, "not a program").unwrap();
    let refused = deadbolt(
        &server.endpoint(),
        &[
            "run",
            "--lock",
            "start",
            "--",
            not_executable.to_str().unwrap(),
        ],
    );
    assert_eq!(refused.status.code(), Some(126), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot start"));
}

/// `deadbolt acquire` stopped while it waits closes its session: nobody
/// could use it, so it must not keep a queue place for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_acquire_leaves_no_session_behind() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let client = server.client().await;
    let holder = client.open_session(Duration::from_secs(30)).await.unwrap();
    let _held = holder.lock("contested").await.unwrap();
    let waiter = Command::new(BIN)
        .args(["acquire", "--lock", "contested", "--ttl", "1h"])
        .env("DEADBOLT_ENDPOINT", server.endpoint())
        .spawn()
        .unwrap();
    let queued = |state: Option<deadbolt_client::LockState>| {
        state.map_or(0, |state| state.waiter_session_ids.len())
    };
    while queued(client.lock_status("contested").await.unwrap()) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal(waiter.id() as i32, libc::SIGINT);
    let output = tokio::task::spawn_blocking(move || waiter.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    // Closed at once, not after the abandon grace or the 1h TTL.
    let state = client.lock_status("contested").await.unwrap();
    assert_eq!(queued(state), 0);
    assert_eq!(
        client.health().await.unwrap().sessions,
        1,
        "only the holder's"
    );
}

#[test]
fn at_most_permits_copies_run_at_once_each_on_a_slot_no_other_holds() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    common::wait_for_newest_cluster_version(&endpoint);
    let slots = dir.path().join("slots");
    std::fs::create_dir(&slots).unwrap();
    // Each copy claims a file named after its slot, refusing to overwrite
    // one (noclobber): two live permits on one slot, or a slot out of
    // range, fail the copy or the assertion below.
    let script = r#"set -eC
        echo "$DEADBOLT_TOKEN" > "$SLOTS/slot-$DEADBOLT_SLOT"
        echo "$DEADBOLT_SLOT $DEADBOLT_TOKEN" >> "$SLOTS/log"
        sleep 0.3
        rm "$SLOTS/slot-$DEADBOLT_SLOT""#;
    let copies: Vec<_> = (0..5)
        .map(|_| {
            Command::new(BIN)
                .args(["run", "--semaphore", "pool", "--permits", "2", "--"])
                .args(["sh", "-c", script])
                .env("DEADBOLT_ENDPOINT", &endpoint)
                .env("SLOTS", &slots)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for copy in copies {
        let output = copy.wait_with_output().unwrap();
        assert!(output.status.success(), "{output:?}");
    }
    let log = std::fs::read_to_string(slots.join("log")).unwrap();
    let runs: Vec<(u32, u64)> = log
        .lines()
        .map(|line| {
            let (slot, token) = line.split_once(' ').unwrap();
            (slot.parse().unwrap(), token.parse().unwrap())
        })
        .collect();
    assert_eq!(runs.len(), 5, "{log}");
    assert!(runs.iter().all(|(slot, _)| *slot < 2), "{log}");
    let tokens: std::collections::BTreeSet<u64> = runs.iter().map(|(_, t)| *t).collect();
    assert_eq!(tokens.len(), 5, "every permit has its own token: {log}");

    // Every copy released its permit: the semaphore is gone, and a lock
    // of the same name may be taken now.
    let lock = deadbolt(&endpoint, &["run", "--lock", "pool", "--", "true"]);
    assert!(lock.status.success(), "{lock:?}");
}

#[test]
fn semaphores_over_http_and_one_name_is_one_kind() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    common::wait_for_newest_cluster_version(&server.endpoint());
    let open = serde_json::json!({ "ttl_ms": 30_000 });
    let (_, session) = common::curl(server.addr, None, "/v1/session/open", Some(&open));
    let ask = |count: u32, wait: bool| {
        serde_json::json!({
            "session_id": session["session_id"],
            "session_secret": session["session_secret"],
            "semaphore": "gpus",
            "capacity": 4,
            "count": count,
            "wait": wait,
        })
    };
    let (status, granted) = common::curl(
        server.addr,
        None,
        "/v1/semaphore/acquire",
        Some(&ask(3, false)),
    );
    assert_eq!(status, 200, "{granted}");
    let permits = granted["permits"].as_array().unwrap();
    let slots: Vec<u64> = permits
        .iter()
        .map(|p| p["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots, vec![0, 1, 2], "{granted}");
    assert_eq!(granted["token"], permits[0]["token"]);

    // Another session asks for two: only one is free.
    let (_, other) = common::curl(server.addr, None, "/v1/session/open", Some(&open));
    let more = serde_json::json!({
        "session_id": other["session_id"],
        "session_secret": other["session_secret"],
        "semaphore": "gpus",
        "capacity": 4,
        "count": 2,
    });
    let (status, busy) = common::curl(server.addr, None, "/v1/semaphore/acquire", Some(&more));
    assert_eq!(
        (status, busy["error"]["kind"].as_str()),
        (423, Some("busy")),
        "{busy}"
    );
    let (status, as_lock) = common::curl(
        server.addr,
        None,
        "/v1/lock/acquire",
        Some(&serde_json::json!({
            "session_id": other["session_id"],
            "session_secret": other["session_secret"],
            "lock": "gpus",
        })),
    );
    assert_eq!(status, 400, "{as_lock}");
    assert!(
        as_lock["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is a semaphore, not a lock"),
        "{as_lock}"
    );

    let (_, state) = common::curl(
        server.addr,
        None,
        "/v1/semaphore/status?semaphore=gpus",
        None,
    );
    assert_eq!(state["state"]["capacity"], 4, "{state}");
    assert_eq!(state["state"]["holders"].as_array().unwrap().len(), 1);
    let shown = deadbolt(&server.endpoint(), &["status", "--semaphore", "gpus"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    let first = permits[0]["token"].as_u64().unwrap();
    assert!(
        shown.starts_with("gpus: 3 of 4 permits held, 0 waiting")
            && shown.contains(&format!("holds token {first} on slot 0, token")),
        "{shown}"
    );

    let release = serde_json::json!({
        "session_id": session["session_id"],
        "session_secret": session["session_secret"],
        "lock": "gpus",
        "token": granted["token"],
    });
    // Each live permit's token is current, as a lock's grant is.
    let second = permits[1]["token"].to_string();
    let check = ["check", "--lock", "gpus", "--token", second.as_str()];
    let current = deadbolt(&server.endpoint(), &check);
    assert!(current.status.success(), "{current:?}");
    let (status, _) = common::curl(server.addr, None, "/v1/semaphore/release", Some(&release));
    assert_eq!(status, 200);
    let released = deadbolt(&server.endpoint(), &check);
    assert_eq!(released.status.code(), Some(76), "{released:?}");
    let (status, granted) = common::curl(server.addr, None, "/v1/semaphore/acquire", Some(&more));
    assert_eq!(status, 200, "{granted}");
}

#[test]
fn semaphores_wait_for_every_member_to_support_them() {
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], deadbolt_testkit::free_port()));
    let server = TestServer::start_with(
        &dir.path().join("data"),
        addr,
        &["--max-feature-level", "2"],
    );
    let refused = deadbolt(
        &server.endpoint(),
        &["run", "--semaphore", "pool", "--permits", "2", "--", "true"],
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("unavailable until upgraded: semaphores need cluster version 3")
            && said.contains("node 1 (this leader) supports feature level 2"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_takes_permits_in_order_and_a_dropped_guard_frees_its_slots() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    common::wait_for_newest_cluster_version(&server.endpoint());
    let client = deadbolt_client::Client::connect([server.endpoint()])
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let (first, second, third) = (
        client.open_session(ttl).await.unwrap(),
        client.open_session(ttl).await.unwrap(),
        client.open_session(ttl).await.unwrap(),
    );
    let slots = |guard: &deadbolt_client::LockGuard| -> Vec<u32> {
        guard.permits().iter().map(|permit| permit.slot).collect()
    };

    let two = first.acquire_permits("pool", 3, 2).await.unwrap();
    assert_eq!(slots(&two), [0, 1]);
    assert_eq!(two.token(), two.permits()[0].token);
    assert_eq!(two.permits()[1].token, two.token() + 1);
    let busy = second.try_acquire_permits("pool", 3, 2).await.unwrap();
    assert!(busy.is_none(), "only one permit is free");
    let one = second
        .acquire_permits_timeout("pool", 3, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(slots(&one), [2]);
    let timed_out = third
        .acquire_permits_timeout("pool", 3, 1, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(
        timed_out.kind(),
        deadbolt_client::ErrorKind::WaitTimeout,
        "{timed_out}"
    );

    // Dropping a guard releases its permits in the background; the waiter
    // gets the lowest free slot and a token above every earlier one.
    let newest = one.token();
    drop(two);
    let next = third.acquire_permits("pool", 3, 1).await.unwrap();
    assert_eq!(slots(&next), [0]);
    assert!(next.token() > newest);
    let state = client.semaphore_status("pool").await.unwrap().unwrap();
    let holders: Vec<u64> = state.holders.iter().map(|h| h.session_id).collect();
    assert_eq!(holders, [second.id(), third.id()], "{state:?}");
    // One permit at a time is `semaphore`: the slot left.
    let fourth = client.open_session(ttl).await.unwrap();
    let last = fourth.semaphore("pool", 3).await.unwrap();
    assert_eq!(slots(&last), [1]);
}

#[test]
fn readers_share_a_read_write_lock_and_a_queued_writer_holds_back_later_readers() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    common::wait_for_newest_cluster_version(&endpoint);
    let acquire = |extra: &[&str]| {
        let args = [&["acquire", "--lock", "doc"][..], extra].concat();
        deadbolt(&endpoint, &args)
    };
    let held = |out: std::process::Output| -> (String, u64) {
        let printed = stdout(&out);
        let (handle, token) = printed.split_once(' ').unwrap_or_else(|| panic!("{out:?}"));
        (handle.to_owned(), token.parse().unwrap())
    };
    let (first, first_token) = held(acquire(&["--shared"]));
    let (second, second_token) = held(acquire(&["--shared"]));
    assert!(second_token > first_token);
    let status = stdout(&deadbolt(&endpoint, &["status", "--lock", "doc"]));
    assert!(
        status.starts_with("doc: read/write lock held shared by session"),
        "{status}"
    );

    // One name, one kind: not a lock while anyone holds it.
    let as_lock = deadbolt(&endpoint, &["run", "--lock", "doc", "--", "true"]);
    assert!(
        String::from_utf8_lossy(&as_lock.stderr)
            .contains("\"doc\" is a read/write lock, not a lock"),
        "{as_lock:?}"
    );
    // A writer cannot get in while readers hold it, and may not write
    // through a reader's token.
    let busy = deadbolt(
        &endpoint,
        &[
            "run",
            "--lock",
            "doc",
            "--exclusive",
            "--no-wait",
            "--",
            "true",
        ],
    );
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let token = first_token.to_string();
    let put = [
        "store", "put", "--lock", "doc", "--token", &token, "doc/body", "x",
    ];
    let refused = deadbolt(&endpoint, &put);
    assert_eq!(refused.status.code(), Some(76), "{refused:?}");

    // A waiting writer: a later reader waits behind it (no writer starvation).
    let marker = dir.path().join("writer-token");
    let mut writer = Command::new(BIN)
        .args(["run", "--lock", "doc", "--exclusive", "--", "sh", "-c"])
        .arg(format!("echo $DEADBOLT_TOKEN > {}", marker.display()))
        .env("DEADBOLT_ENDPOINT", &endpoint)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stdout(&deadbolt(&endpoint, &["status", "--lock", "doc"])).contains("waits exclusive") {
        assert!(Instant::now() < deadline, "the writer never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    let late = acquire(&["--shared", "--no-wait"]);
    assert_eq!(late.status.code(), Some(75), "{late:?}");

    for (handle, token) in [(first, first_token), (second, second_token)] {
        let token = token.to_string();
        let args = [
            "release",
            "--lock",
            "doc",
            "--session",
            &handle,
            "--token",
            &token,
        ];
        assert!(deadbolt(&endpoint, &args).status.success());
    }
    assert!(writer.wait().unwrap().success());
    let written: u64 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        written > second_token,
        "the writer's token is above every reader's"
    );

    let (status, reply) = common::curl(
        server.addr,
        None,
        "/v1/lock/acquire",
        Some(&serde_json::json!({ "session_id": 1, "lock": "doc", "mode": "read" })),
    );
    assert_eq!(status, 400, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("\"shared\" or \"exclusive\""));
}

/// Polls `deadbolt leader ELECTION` until its output contains `wanted`.
fn wait_for_leader(endpoint: &str, election: &str, wanted: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = stdout(&deadbolt(endpoint, &["leader", election]));
        if shown.contains(wanted) {
            return shown;
        }
        assert!(Instant::now() < deadline, "never {wanted:?}: {shown}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_the_next_candidate_takes_over_with_a_higher_term() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    common::wait_for_newest_cluster_version(&endpoint);
    let elect = |value: &str, script: String| {
        Command::new(BIN)
            .args([
                "elect",
                "scheduler",
                "--value",
                value,
                "--",
                "sh",
                "-c",
                &script,
            ])
            .env("DEADBOLT_ENDPOINT", &endpoint)
            .spawn()
            .unwrap()
    };
    let (term_a, term_b) = (dir.path().join("a"), dir.path().join("b"));
    let mut first = elect(
        "node-a",
        format!("echo $DEADBOLT_TOKEN > {}; sleep 60", term_a.display()),
    );
    let shown = wait_for_leader(&endpoint, "scheduler", "value \"node-a\"");
    let mut second = elect(
        "node-b",
        format!("echo $DEADBOLT_TOKEN > {}", term_b.display()),
    );
    wait_for_leader(&endpoint, "scheduler", "1 candidates waiting");
    assert!(
        !term_b.exists(),
        "a candidate ran its command while another led"
    );

    // Only the leader proclaims, and only with its own term.
    let client = deadbolt_client::Client::connect([endpoint.clone()])
        .await
        .unwrap();
    let other = client.open_session(Duration::from_secs(30)).await.unwrap();
    let term: u64 = std::fs::read_to_string(&term_a)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(shown.contains(&format!("term {term}")), "{shown}");
    let refused = client
        .proclaim_raw(other.handle(), "scheduler", term, "usurper")
        .await
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        deadbolt_client::ErrorKind::NotHolder,
        "{refused}"
    );
    let led = client.leader("scheduler").await.unwrap().leader.unwrap();
    assert_eq!((led.term, led.value.as_str()), (term, "node-a"));

    // The leader steps down: the candidate is elected with a larger term.
    signal(first.id() as i32, libc::SIGTERM);
    first.wait().unwrap();
    assert!(second.wait().unwrap().success());
    let next: u64 = std::fs::read_to_string(&term_b)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(next > term, "term {next} after {term}");

    // The Rust client's election handle: campaign, proclaim, leader,
    // observe, resign.
    let election = client.election("scheduler");
    let guard = election.campaign(&other, "rust").await.unwrap();
    assert!(guard.token() > next);
    let mut changes = election.observe().await.unwrap();
    guard.proclaim("rust, proclaimed").await.unwrap();
    let led = election.leader().await.unwrap().leader.unwrap();
    assert_eq!(
        (led.term, led.value.as_str()),
        (guard.token(), "rust, proclaimed")
    );
    let term = guard.token();
    guard.resign().await.unwrap();
    // The observer's last word: nobody leads, after the proclaimed term.
    loop {
        let seen = changes.next().await.unwrap();
        match seen.leader {
            Some(leader) => assert_eq!(leader.term, term),
            None => break,
        }
    }
    wait_for_leader(&endpoint, "scheduler", "no leader");
}

#[test]
fn data_check_counts_the_semaphores_read_write_locks_and_elections_a_stopped_node_holds() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = TestServer::start(&data);
    let endpoint = server.endpoint();
    common::wait_for_newest_cluster_version(&endpoint);
    for args in [
        &[
            "acquire",
            "--ttl",
            "1h",
            "--semaphore",
            "pool",
            "--permits",
            "2",
        ][..],
        &["acquire", "--ttl", "1h", "--lock", "catalog", "--shared"][..],
        &["acquire", "--ttl", "1h", "--election", "scheduler"][..],
    ] {
        let taken = deadbolt(&endpoint, args);
        assert!(taken.status.success(), "{args:?}: {taken:?}");
    }
    server.kill9();
    let data_dir = data.to_str().unwrap();
    let report = deadbolt(
        &endpoint,
        &["data", "check", "--json", "--data-dir", data_dir],
    );
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let counts =
        ["semaphores", "rw_locks", "elections", "locks"].map(|kind| &report["report"][kind]);
    assert_eq!(counts, [1, 1, 1, 0], "{report}");
}

#[test]
fn leader_watch_prints_each_change_of_leadership() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    common::wait_for_newest_cluster_version(&endpoint);
    let mut watcher = Command::new(BIN)
        .args(["leader", "jobs", "--watch"])
        .env("DEADBOLT_ENDPOINT", &endpoint)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Its lines, as they come; each step waits for the one it caused.
    let (lines, printed) = std::sync::mpsc::channel();
    let output = std::io::BufReader::new(watcher.stdout.take().unwrap());
    std::thread::spawn(move || {
        output
            .lines()
            .map_while(Result::ok)
            .for_each(|l| lines.send(l).unwrap())
    });
    let next_line = || {
        printed
            .recv_timeout(Duration::from_secs(10))
            .expect("a line from the watcher")
    };
    assert!(next_line().contains("no leader"));
    let elected = deadbolt(
        &endpoint,
        &["acquire", "--election", "jobs", "--value", "a"],
    );
    let (handle, term) = stdout(&elected)
        .split_once(' ')
        .map(|(h, t)| (h.to_owned(), t.to_owned()))
        .unwrap();
    let led = next_line();
    assert!(
        led.contains(&format!("in term {term}, value \"a\"")),
        "{led}"
    );
    let resign = [
        "release",
        "--lock",
        "jobs",
        "--session",
        &handle,
        "--token",
        &term,
    ];
    assert!(deadbolt(&endpoint, &resign).status.success());
    assert!(next_line().contains("no leader"));
    signal(watcher.id() as i32, libc::SIGTERM);
    assert!(watcher.wait().unwrap().success());
}

#[test]
fn an_admin_defines_a_semaphore_that_stays_and_resizes_it_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    common::wait_for_newest_cluster_version(&endpoint);
    // Not defined yet: a run that names no permits is told how to fix it.
    let undefined = deadbolt(&endpoint, &["run", "--semaphore", "gpus", "--", "true"]);
    assert_eq!(undefined.status.code(), Some(1), "{undefined:?}");
    let said = String::from_utf8_lossy(&undefined.stderr);
    assert!(
        said.contains("does not exist") && said.contains("semaphore define"),
        "{said}"
    );
    let defined = deadbolt(
        &endpoint,
        &["semaphore", "define", "gpus", "--permits", "2"],
    );
    assert!(stdout(&defined).contains("0 of 2 permits held, 0 waiting (defined"));
    // A run names no permits, and sees its slot; the semaphore stays after.
    let ran = deadbolt(
        &endpoint,
        &[
            "run",
            "--semaphore",
            "gpus",
            "--",
            "sh",
            "-c",
            "echo slot=$DEADBOLT_SLOT",
        ],
    );
    assert_eq!(stdout(&ran), "slot=0");
    let shown = deadbolt(&endpoint, &["semaphore", "status", "gpus", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(shown["state"]["defined"], true, "{shown}");
    assert_eq!(shown["state"]["capacity"], 2, "{shown}");
    // Another count is refused, and says how a count changes.
    let other = deadbolt(
        &endpoint,
        &["acquire", "--semaphore", "gpus", "--permits", "3"],
    );
    assert_eq!(other.status.code(), Some(1), "{other:?}");
    assert!(String::from_utf8_lossy(&other.stderr).contains("semaphore define"));
    // The admin's resize is the change: acquirers follow it.
    let resized = deadbolt(
        &endpoint,
        &["semaphore", "define", "gpus", "--permits", "3"],
    );
    assert!(stdout(&resized).contains("0 of 3 permits held"));
    for _ in 0..3 {
        let taken = deadbolt(&endpoint, &["acquire", "--semaphore", "gpus", "--no-wait"]);
        assert!(taken.status.success(), "{taken:?}");
    }
    let full = deadbolt(&endpoint, &["acquire", "--semaphore", "gpus", "--no-wait"]);
    assert_eq!(full.status.code(), Some(75), "{full:?}");
    // Deleted while held: it goes with its last permit.
    let deleted = deadbolt(&endpoint, &["semaphore", "delete", "gpus"]);
    assert!(stdout(&deleted).contains("no longer defined"));
    let kept = deadbolt(&endpoint, &["semaphore", "status", "gpus"]);
    assert!(
        stdout(&kept).contains("3 of 3 permits held, 0 waiting"),
        "{kept:?}"
    );
    let gone = deadbolt(&endpoint, &["semaphore", "delete", "gpus"]);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
    let said = String::from_utf8_lossy(&gone.stderr);
    assert!(said.contains("was not defined by an admin"), "{said}");
}
