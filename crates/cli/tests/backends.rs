//! `deadbolt run --backend`, `bench --backend` and `backends`: the CLI over
//! the Deadbolt server through `deadbolt-backends`' adapter and over a real
//! `redis-server` (started per test by `deadbolt_testkit::peers`), with the
//! exit codes of `deadbolt run`.

mod common;

use common::{deadbolt, signal, TestServer, BIN};
use deadbolt_testkit::peers;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `deadbolt run --backend URL --lock LOCK EXTRA... -- COMMAND...`
fn run_command(url: &str, lock: &str, extra: &[&str], command: &[&str]) -> Command {
    let mut run = Command::new(BIN);
    run.args(["run", "--backend", url, "--lock", lock])
        .args(extra)
        .arg("--")
        .args(command);
    run
}

fn run(url: &str, lock: &str, extra: &[&str], command: &[&str]) -> std::process::Output {
    run_command(url, lock, extra, command).output().unwrap()
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn run_over_the_deadbolt_server_gives_the_fencing_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let output = run(
        &server.endpoint(),
        "job",
        &[],
        &["sh", "-c", "echo \"$DEADBOLT_TOKEN\"; exit 7"],
    );
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    let token: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(token > 0);
}

#[test]
fn run_over_redis_keeps_the_exit_codes() {
    let Some(mut redis) = peers::redis() else {
        return;
    };
    let url = format!("redis://{}", redis.address());

    // The command's own code; the counter under its own name, never as
    // $DEADBOLT_TOKEN.
    let counted = format!("{url}?fence=counter");
    let output = run(
        &counted,
        "job",
        &[],
        &[
            "sh",
            "-c",
            "echo \"token=$DEADBOLT_TOKEN counter=$DEADBOLT_UNSAFE_COUNTER\"; exit 3",
        ],
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "token= counter=1"
    );

    // Busy: --no-wait and --wait both exit 75.
    let mut holder = run_command(&url, "busy", &[], &["sleep", "5"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for wait in [&["--no-wait"][..], &["--wait", "300ms"]] {
        let output = run(&url, "busy", wait, &["true"]);
        assert_eq!(
            output.status.code(),
            Some(75),
            "{wait:?}: {}",
            stderr(&output)
        );
    }
    holder.kill().unwrap();
    holder.wait().unwrap();

    // A bad URL is a usage error that says what is wrong; a dead server 69.
    let output = run("redlock://a:1,b:2", "x", &[], &["true"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("at least 3 independent Redis masters"));
    let output = run("redis://127.0.0.1:1", "x", &["--no-wait"], &["true"]);
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    // Neither says the password of the URL.
    let output = run("redlock://:hunter2@a:1,:hunter2@b:2", "x", &[], &["true"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains(":***@a:1"), "{}", stderr(&output));
    assert!(!stderr(&output).contains("hunter2"), "{}", stderr(&output));
    let output = run(
        "redis://:hunter2@127.0.0.1:1",
        "x",
        &["--no-wait"],
        &["true"],
    );
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(!stderr(&output).contains("hunter2"), "{}", stderr(&output));

    // The server dies mid-command: the command is stopped before the TTL
    // (3s) could end, and run exits 76.
    let started = Instant::now();
    let running = run_command(&url, "lost", &["--ttl", "3s"], &["sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    redis.kill();
    let output = running.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn bench_measures_a_backend_with_the_same_report() {
    let Some(redis) = peers::redis() else {
        return;
    };
    let url = format!("redis://{}", redis.address());
    let output = deadbolt(
        "http://127.0.0.1:1",
        &[
            "bench",
            "contended",
            "--backend",
            &url,
            "--clients",
            "2",
            "--duration",
            "1s",
            "--warmup",
            "0s",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        report.contains("contended: 2 clients over 2 sessions (redis)"),
        "{report}"
    );
    assert!(
        report.contains("no tokens (this lock system issues none)"),
        "{report}"
    );
}

#[test]
fn backends_lists_every_backend_with_its_guarantees() {
    let output = deadbolt("http://127.0.0.1:1", &["backends", "--json"]);
    assert!(output.status.success());
    let labels: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = labels
        .as_array()
        .unwrap()
        .iter()
        .map(|label| label["backend"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["deadbolt", "redis", "redlock", "etcd", "postgres"]);
    for label in labels.as_array().unwrap() {
        for field in ["server_crash", "failover", "client_pause", "token", "seeds"] {
            assert!(!label[field].as_str().unwrap().is_empty(), "{label}");
        }
    }
}

/// A protected resource in two files, written by the commands under the
/// lock: `unfenced` takes every write; `fenced` keeps the highest token it
/// accepted (`fence.max`, under flock) and refuses lower ones, as
/// `deadbolt-fence` does. The token is `$DEADBOLT_TOKEN`, or Redis's counter.
const WRITE: &str = r#"
write() {
    token=${DEADBOLT_TOKEN:-${DEADBOLT_UNSAFE_COUNTER:-}}
    echo "$1" >> unfenced
    exec 9>> fence.lock
    flock 9
    max=$(cat fence.max 2>/dev/null || echo 0)
    if [ -n "$token" ] && [ "$token" -ge "$max" ]; then
        echo "$token" > fence.max
        echo "$1 accepted" >> fenced
    else
        echo "$1 refused" >> fenced
    fi
    exec 9>&-
}
"#;

/// The seeds' first fault, for one backend: a client frozen past its lease
/// (SIGSTOP of `deadbolt run` and of its command, as a GC pause or a stalled
/// VM freezes a whole process). Another run gets the lock once the lease
/// runs out and writes; then the frozen command wakes and finishes its
/// write, before its `run` wakes to stop it. The unfenced resource accepts
/// that late write, on every backend; the fenced one refuses it wherever
/// there is a token. Resumed, the frozen run finds its lease gone and exits
/// 76. Returns what the fenced resource answered, in order.
fn a_frozen_holder_loses_the_lock_after_its_ttl(url: &str) -> Vec<String> {
    const TTL: Duration = Duration::from_secs(2);
    let dir = tempfile::tempdir().unwrap();
    let in_dir = |script: &str| format!("cd {}; {WRITE}{script}", dir.path().display());
    // Unique: the PostgreSQL server is shared.
    let lock = format!("frozen-{}", std::process::id());
    let holder_script = in_dir(
        // Still running after its write, so that its run, resumed, must stop it.
        "echo $$ > pid; until [ -e go ]; do sleep 0.02; done; write holder; exec sleep 30",
    );
    let mut holder = run_command(url, &lock, &["--ttl", "2s"], &["sh", "-c", &holder_script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let command = wait_for_pid(&dir.path().join("pid"));
    signal(holder.id() as i32, libc::SIGSTOP);
    signal(command, libc::SIGSTOP);
    let frozen = Instant::now();

    let taker = run(
        url,
        &lock,
        &["--ttl", "2s", "--wait", "20s"],
        &["sh", "-c", &in_dir("write taker")],
    );
    let handover = frozen.elapsed();
    assert_eq!(taker.status.code(), Some(0), "{}", stderr(&taker));
    assert!(
        handover > TTL / 2 && handover < TTL + Duration::from_secs(3),
        "the lock passed on {handover:?} after the freeze (TTL {TTL:?})"
    );

    // The command wakes first and completes its write; then its run.
    std::fs::write(dir.path().join("go"), "").unwrap();
    signal(command, libc::SIGCONT);
    // The fenced file is written last.
    let fenced = dir.path().join("fenced");
    let started = Instant::now();
    while !std::fs::read_to_string(&fenced).unwrap().contains("holder") {
        assert!(started.elapsed() < Duration::from_secs(10), "no late write");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(holder.id() as i32, libc::SIGCONT);
    while holder.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the resumed run did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = holder.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));

    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert_eq!(
        read("unfenced"),
        "taker\nholder\n",
        "the late write reached the unfenced resource"
    );
    let fenced = read("fenced");
    // The scheme only: a PostgreSQL URL carries a password.
    let backend = url.split("://").next().unwrap_or_default();
    eprintln!(
        "{backend}: lock passed on {handover:?} after the holder froze (TTL {TTL:?}); \
         unfenced resource accepted the late write; fenced: {:?}",
        fenced.lines().collect::<Vec<_>>()
    );
    fenced.lines().map(str::to_owned).collect()
}

/// The fenced resource took the new holder's write and refused the frozen
/// one's.
const FENCED: [&str; 2] = ["taker accepted", "holder refused"];

fn wait_for_pid(path: &std::path::Path) -> i32 {
    let started = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_frozen_holder_over_deadbolt() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    assert_eq!(
        a_frozen_holder_loses_the_lock_after_its_ttl(&server.endpoint()),
        FENCED
    );
}

/// With the counter: it fences this fault, as the server kept its memory.
#[test]
fn a_frozen_holder_over_redis() {
    let Some(redis) = peers::redis() else {
        return;
    };
    let url = format!("redis://{}?fence=counter", redis.address());
    assert_eq!(a_frozen_holder_loses_the_lock_after_its_ttl(&url), FENCED);
}

/// No token at all: the fenced resource has nothing to go by and refuses
/// both, so Redlock's users are left with the unfenced one.
#[test]
fn a_frozen_holder_over_redlock() {
    let servers: Option<Vec<_>> = (0..3).map(|_| peers::redis()).collect();
    let Some(servers) = servers else {
        return;
    };
    let nodes: Vec<String> = servers.iter().map(peers::Server::address).collect();
    let url = format!("redlock://{}", nodes.join(","));
    assert_eq!(
        a_frozen_holder_loses_the_lock_after_its_ttl(&url),
        ["taker refused", "holder refused"]
    );
}

#[test]
fn a_frozen_holder_over_etcd() {
    let Some(etcd) = peers::etcd() else {
        return;
    };
    let url = format!("etcd://{}", etcd.address());
    assert_eq!(a_frozen_holder_loses_the_lock_after_its_ttl(&url), FENCED);
}

/// The "holder hung with its socket open" case: the connection stays up,
/// and only `idle_session_timeout` frees the lock.
#[test]
fn a_frozen_holder_over_postgres() {
    let Some(url) = peers::postgres_url() else {
        return;
    };
    assert_eq!(a_frozen_holder_loses_the_lock_after_its_ttl(&url), FENCED);
}

#[test]
fn a_primitive_with_backend_is_refused_with_what_that_system_offers() {
    // Refused before any connection: the URLs need not answer.
    for (url, flags, offers) in [
        (
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            &["--election", "e"][..],
            "only an exclusive lock",
        ),
        (
            "postgres://u:p@127.0.0.1:1/db",
            &["--election", "e"][..],
            "pg_advisory_lock_shared",
        ),
        (
            "etcd://127.0.0.1:1",
            &["--lock", "l", "--shared"][..],
            "client recipes",
        ),
        (
            "redis://127.0.0.1:1",
            &["--semaphore", "s", "--permits", "2"][..],
            "not supported here",
        ),
    ] {
        let refused = Command::new(BIN)
            .args(["run", "--backend", url])
            .args(flags)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(refused.status.code(), Some(2), "{refused:?}");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            said.contains("not supported with --backend") && said.contains(offers),
            "{said}"
        );
    }
}

/// etcd's own elections through `elect --backend` and `leader
/// --backend`: the leader's command sees its term as `$DEADBOLT_TOKEN`,
/// `leader` shows that term and the value, a second candidate times out
/// while the first leads and wins the next, larger term once it resigned.
#[test]
fn an_etcd_election_runs_one_leader_and_says_who_leads() {
    let Some(etcd) = peers::etcd() else {
        return;
    };
    let url = format!("etcd://{}", etcd.address());
    let election = format!("etcd-elect-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let (term_file, go) = (dir.path().join("term"), dir.path().join("go"));
    let elect = |value: &str, extra: &[&str], script: &str| {
        let mut elect = Command::new(BIN);
        elect
            .args(["elect", &election, "--backend", &url, "--value", value])
            .args(["--ttl", "2s"])
            .args(extra)
            .args(["--", "sh", "-c", script]);
        elect
    };
    let leader = || {
        let output = Command::new(BIN)
            .args(["leader", &election, "--backend", &url, "--json"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    assert_eq!(leader()["leader"], serde_json::Value::Null);

    // The first leads until it is told to go.
    let script = format!(
        "echo $DEADBOLT_TOKEN > {0}.tmp; mv {0}.tmp {0}; while [ ! -e {1} ]; do sleep 0.05; done",
        term_file.display(),
        go.display()
    );
    let mut first = elect("first", &[], &script).spawn().unwrap();
    let started = Instant::now();
    while !term_file.exists() {
        assert!(started.elapsed() < Duration::from_secs(20), "never led");
        std::thread::sleep(Duration::from_millis(50));
    }
    let term: u64 = std::fs::read_to_string(&term_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let led = leader();
    assert_eq!(led["leader"]["value"], "first", "{led}");
    assert_eq!(led["leader"]["term"], term, "{led}");

    let busy = elect("second", &["--wait", "500ms"], "true")
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(75), "{}", stderr(&busy));

    std::fs::write(&go, "").unwrap();
    assert!(first.wait().unwrap().success());
    let second = elect("second", &[], "echo $DEADBOLT_TOKEN")
        .output()
        .unwrap();
    assert!(second.status.success(), "{}", stderr(&second));
    let next: u64 = String::from_utf8_lossy(&second.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(next > term, "term {next} after {term}");
    assert_eq!(leader()["leader"], serde_json::Value::Null);
}

/// PostgreSQL's shared advisory locks through `run --backend --shared`:
/// a second reader runs beside the first, a writer (`--exclusive`) does
/// not.
#[test]
fn readers_share_a_postgres_lock_and_a_writer_waits() {
    let Some(url) = peers::postgres_url() else {
        return;
    };
    let lock = format!("pg-readers-{}", std::process::id());
    let run = |extra: &[&str], command: &[&str]| {
        let mut run = Command::new(BIN);
        run.args(["run", "--backend", &url, "--lock", &lock])
            .args(extra)
            .arg("--")
            .args(command);
        run
    };
    let mut reader = run(&["--shared"], &["sleep", "3"]).spawn().unwrap();
    // The first reader holds it once a writer is refused.
    let started = Instant::now();
    loop {
        let writer = run(&["--exclusive", "--no-wait"], &["true"])
            .output()
            .unwrap();
        if writer.status.code() == Some(75) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{writer:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = run(
        &["--shared", "--no-wait"],
        &["sh", "-c", "echo $DEADBOLT_TOKEN"],
    )
    .output()
    .unwrap();
    assert!(second.status.success(), "{second:?}");
    assert!(!String::from_utf8_lossy(&second.stdout).trim().is_empty());
    assert!(reader.wait().unwrap().success());
    let writer = run(&["--exclusive", "--no-wait"], &["true"])
        .output()
        .unwrap();
    assert!(writer.status.success(), "{writer:?}");
}
