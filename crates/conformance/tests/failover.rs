//! Failover that callers never see (issue 59): one 3-node cluster whose
//! leader is killed with `-9` twenty times in a row (restarted each time),
//! then paused with `SIGSTOP` and cut off from its followers (but not from
//! its clients), while every client takes and releases locks through it:
//! each client's driver given every endpoint, one node's address, and
//! haproxy's; `deadbolt run --wait` in a loop the same three ways; and a
//! Rust session holding a lock with a 5 s TTL throughout.
//!
//! Passes when no caller saw an error, no lease was lost, and every
//! worker's tokens strictly increased. It prints, for each client and way
//! in, the time from each fault to that worker's next grant (median and
//! max): the figures of docs/performance.md's failover table.
//!
//! The clients are the conformance suite's drivers (see conformance.rs):
//! Rust always, Python, TypeScript and Go when their drivers are set up
//! (`DEADBOLT_REQUIRE_CLIENTS=1` makes a missing one a failure).

use deadbolt_conformance::{ClientUnderTest, Driver};
use deadbolt_testkit::{signal, TestCluster};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Kills of the leader in a row, as the issue asks.
const KILLS: usize = 20;
/// Pauses, and cuts, of the leader.
const PAUSES: usize = 3;
const CUTS: usize = 3;
/// The holder's session TTL, as the issue asks: its lease must outlive
/// each fault.
const HOLDER_TTL: Duration = Duration::from_secs(5);
/// The workers' session TTL (and `deadbolt run --ttl`): twice the holder's,
/// since a worker's lease also carries its locks' traffic through faults
/// that come one after another on two shared cores; a loss is still an
/// error.
const TTL: Duration = Duration::from_secs(10);
/// How long a worker's acquire may wait: a caller with time left.
const WAIT: Duration = Duration::from_secs(20);
/// Between a worker's pairs: enough for a grant shortly after each fault to
/// show, without the workers taking the two cores from the nodes.
const BETWEEN_PAIRS: Duration = Duration::from_millis(250);
/// After the cluster has a new leader (and the faulted node is back), before
/// the next fault: time for every worker to take a lock again.
const SETTLE: Duration = Duration::from_millis(2000);

/// Lines of each node's log shown when the test fails: the last faults'.
const LOG_TAIL: usize = 400;

fn server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("DEADBOLT_BIN") {
        return bin.into();
    }
    let driver = Path::new(env!("CARGO_BIN_EXE_deadbolt-conformance-driver"));
    driver.with_file_name("deadbolt")
}

fn required() -> bool {
    std::env::var("DEADBOLT_REQUIRE_CLIENTS").is_ok_and(|value| value == "1")
}

/// Every client whose driver is here: the same ones conformance.rs runs.
fn clients() -> Vec<ClientUnderTest> {
    let mut clients = vec![ClientUnderTest {
        name: "rust".into(),
        program: env!("CARGO_BIN_EXE_deadbolt-conformance-driver").into(),
        args: Vec::new(),
    }];
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let optional = [
        ("python", "DEADBOLT_PYTHON", None),
        ("python-async", "DEADBOLT_PYTHON", Some("--async")),
        ("typescript", "DEADBOLT_NODE_DRIVER", None),
        ("go", "DEADBOLT_GO_DRIVER", None),
    ];
    for (name, variable, flag) in optional {
        let Some(value) = std::env::var_os(variable) else {
            assert!(
                !required(),
                "{variable} is not set (scripts/test.sh sets it)"
            );
            eprintln!("skipped {name}: {variable} is not set");
            continue;
        };
        let (program, mut args) = match variable {
            "DEADBOLT_PYTHON" => (
                PathBuf::from(value),
                vec![manifest
                    .join("../../clients/python/conformance/driver.py")
                    .to_string_lossy()
                    .into_owned()],
            ),
            "DEADBOLT_NODE_DRIVER" => (
                PathBuf::from("node"),
                vec![value.to_string_lossy().into_owned()],
            ),
            _ => (PathBuf::from(value), Vec::new()),
        };
        args.extend(flag.map(str::to_owned));
        clients.push(ClientUnderTest {
            name: name.into(),
            program,
            args,
        });
    }
    clients
}

/// What one worker saw: when each grant came (with its token), and every
/// error it was shown.
#[derive(Default)]
struct Seen {
    grants: Vec<(Instant, u64)>,
    errors: Vec<String>,
}

type Record = Arc<Mutex<BTreeMap<String, Seen>>>;

fn note(record: &Record, worker: &str, seen: Result<u64, String>) {
    let mut record = record.lock().unwrap();
    let entry = record.entry(worker.to_owned()).or_default();
    match seen {
        Ok(token) => entry.grants.push((Instant::now(), token)),
        Err(error) => entry.errors.push(error),
    }
}

/// A driver taking and releasing `lock` until `stop`.
async fn driver_worker(
    client: ClientUnderTest,
    endpoints: Vec<String>,
    worker: String,
    record: Record,
    stop: Arc<AtomicBool>,
) {
    let failed = |error: anyhow::Error| note(&record, &worker, Err(format!("{error:#}")));
    let mut driver = match Driver::start(&client) {
        Ok(driver) => driver,
        Err(error) => return failed(error),
    };
    if let Err(error) = driver.connect(&endpoints).await {
        return failed(error);
    }
    let mut session = match driver.open(TTL).await {
        Ok(session) => session,
        Err(error) => return failed(error),
    };
    let lock = format!("failover-{worker}");
    while !stop.load(Ordering::Relaxed) {
        let granted = driver
            .call(
                "lock",
                json!({ "session": session, "name": lock, "timeout_ms": WAIT.as_millis() as u64 }),
            )
            .await;
        let token = match granted {
            Ok(Ok(granted)) => match deadbolt_conformance::token(&granted) {
                Ok(token) => token,
                Err(error) => return failed(error),
            },
            Ok(Err(refusal)) => {
                failed(anyhow::anyhow!("lock: {refusal}"));
                // A lost lease: the error is counted; go on with a new session.
                if matches!(
                    refusal.kind.as_str(),
                    "session_expiring" | "unknown_session"
                ) {
                    match driver.open(TTL).await {
                        Ok(opened) => session = opened,
                        Err(error) => return failed(error),
                    }
                }
                continue;
            }
            Err(error) => return failed(error),
        };
        note(&record, &worker, Ok(token));
        if let Err(error) = driver.release(session, &lock).await {
            failed(error);
        }
        tokio::time::sleep(BETWEEN_PAIRS).await;
    }
    if let Err(error) = driver.ok("close", json!({ "session": session })).await {
        failed(error);
    }
}

/// `deadbolt run --wait` in a loop until `stop`: each run prints the
/// token it was given.
async fn run_worker(
    bin: PathBuf,
    endpoints: Vec<String>,
    worker: String,
    record: Record,
    stop: Arc<AtomicBool>,
) {
    let lock = format!("failover-{worker}");
    let ttl = format!("{}s", TTL.as_secs());
    while !stop.load(Ordering::Relaxed) {
        let output = tokio::process::Command::new(&bin)
            .arg("--endpoint")
            .arg(endpoints.join(","))
            .args(["run", "--lock", &lock, "--ttl", &ttl, "--wait", "20s", "--"])
            .args(["sh", "-c", "echo $DEADBOLT_TOKEN"])
            .kill_on_drop(true)
            .output()
            .await;
        let seen = match output {
            Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("printed {:?}", String::from_utf8_lossy(&output.stdout))),
            Ok(output) => Err(format!(
                "exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(error) => Err(format!("cannot start {}: {error}", bin.display())),
        };
        note(&record, &worker, seen);
        tokio::time::sleep(BETWEEN_PAIRS).await;
    }
}

/// The node that says it leads and that every node of `asked` names,
/// asked without blocking the runtime (a paused node never answers).
async fn leader_among(cluster: &TestCluster, asked: &[u64], within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let statuses: Vec<serde_json::Value> = asked
            .iter()
            .filter_map(|id| cluster.node(*id).status())
            .collect();
        let agreed = (statuses.len() == asked.len())
            .then_some(())
            .and_then(|()| statuses.iter().find(|status| status["role"] == "leader"))
            .and_then(|status| status["node_id"].as_u64())
            .filter(|leader| {
                statuses
                    .iter()
                    .all(|status| status["leader_id"].as_u64() == Some(*leader))
            });
        if let Some(leader) = agreed {
            return leader;
        }
        assert!(
            Instant::now() < deadline,
            "nodes {asked:?} agreed on no leader within {within:?}; logs:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader's fault, and how the cluster gets over it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    Pause,
    Cut,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_crash_pause_or_cut_reaches_no_caller() {
    let bin = server_bin();
    assert!(bin.exists(), "no server binary at {}", bin.display());
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = TestCluster::start(&bin, dir.path(), 3).await;
    let addresses: Vec<std::net::SocketAddr> =
        cluster.nodes.iter().map(|node| node.listen).collect();
    let balancer = deadbolt_testkit::peers::haproxy(&addresses);
    let required_balancer = std::env::var("DEADBOLT_REQUIRE_BACKENDS").is_ok_and(|v| v == "1");
    assert!(
        balancer.is_some() || !required_balancer,
        "no haproxy (scripts/backends.sh installs it)"
    );
    let mut ways: Vec<(&str, Vec<String>)> = vec![
        ("every-endpoint", cluster.endpoints()),
        ("one-node", vec![cluster.node(3).endpoint()]),
    ];
    if let Some(balancer) = &balancer {
        ways.push((
            "haproxy",
            vec![format!("http://127.0.0.1:{}", balancer.port)],
        ));
    }

    let record = Record::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for client in clients() {
        for (way, endpoints) in &ways {
            let worker = format!("{}-{way}", client.name);
            workers.spawn(driver_worker(
                client.clone(),
                endpoints.clone(),
                worker,
                record.clone(),
                stop.clone(),
            ));
        }
    }
    for (way, endpoints) in &ways {
        let worker = format!("deadbolt-run-{way}");
        workers.spawn(run_worker(
            bin.clone(),
            endpoints.clone(),
            worker,
            record.clone(),
            stop.clone(),
        ));
    }

    // A holder for the whole run: its lease must ride through every fault.
    let holder_client = clients().remove(0);
    let mut holder = Driver::start(&holder_client).unwrap();
    holder.connect(&cluster.endpoints()).await.unwrap();
    let holder_session = holder.open(HOLDER_TTL).await.unwrap();
    let held = holder.lock(holder_session, "failover-held").await.unwrap();
    let lost = holder
        .send("lost", json!({ "session": holder_session, "margin_ms": 0 }))
        .await
        .unwrap();
    // When the holder's client said its lease was lost, if it did.
    let lost = tokio::spawn(async move {
        let mut lost = lost;
        loop {
            if let Some(answer) = lost.within(Duration::from_secs(1)).await.transpose() {
                return (Instant::now(), answer);
            }
        }
    });

    tokio::time::sleep(SETTLE).await;
    let all = [1, 2, 3];
    let mut faults: Vec<(Fault, Instant)> = Vec::new();
    // Each fault in the nodes' own clock (their logs' UTC times), which
    // node it struck and how long the others took to agree on a leader:
    // printed after the figures, and the nodes' logs with them on failure.
    let mut timeline = Vec::new();
    let plan = std::iter::repeat_n(Fault::Kill, KILLS)
        .chain(std::iter::repeat_n(Fault::Pause, PAUSES))
        .chain(std::iter::repeat_n(Fault::Cut, CUTS));
    for fault in plan {
        let leader = leader_among(&cluster, &all, Duration::from_secs(20)).await;
        let others: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();
        let started = Instant::now();
        faults.push((fault, started));
        let wall = humantime::format_rfc3339_millis(std::time::SystemTime::now());
        let led = |next: u64| {
            format!(
                "{wall} {fault:?} of leader {leader}: node {next} led after {:?}",
                started.elapsed()
            )
        };
        timeline.push(match fault {
            Fault::Kill => {
                cluster.kill9(leader);
                let next = led(leader_among(&cluster, &others, Duration::from_secs(20)).await);
                cluster.start_node(leader);
                next
            }
            Fault::Pause => {
                let pid = cluster.pid(leader).expect("the leader runs");
                signal(pid, libc::SIGSTOP);
                let next = led(leader_among(&cluster, &others, Duration::from_secs(20)).await);
                tokio::time::sleep(Duration::from_secs(1)).await;
                signal(pid, libc::SIGCONT);
                next
            }
            Fault::Cut => {
                cluster.isolate(leader);
                let next = led(leader_among(&cluster, &others, Duration::from_secs(20)).await);
                tokio::time::sleep(Duration::from_secs(1)).await;
                cluster.heal();
                next
            }
        });
        tokio::time::sleep(SETTLE).await;
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = workers.join_next().await {
        done.unwrap();
    }

    let lost_answer = match lost.is_finished() {
        true => Some(lost.await),
        false => {
            lost.abort();
            None
        }
    };
    let status = holder.status("failover-held").await;
    let released = holder.release(holder_session, "failover-held").await;

    // The figures first, so that a failure still shows them.
    let record = record.lock().unwrap();
    let mut failures = Vec::new();
    eprintln!("time from each fault of the leader to the worker's next grant (median / max, ms):");
    for (worker, seen) in record.iter() {
        let mut between: Vec<u128> = seen
            .grants
            .windows(2)
            .map(|pair| pair[1].0.duration_since(pair[0].0).as_millis())
            .collect();
        between.sort_unstable();
        let usual = between.get(between.len() / 2).copied().unwrap_or_default();
        let mut line = format!(
            "  {worker:<28} {:>5} grants, {usual:>4} ms apart",
            seen.grants.len()
        );
        for kind in [Fault::Kill, Fault::Pause, Fault::Cut] {
            let mut gaps: Vec<u128> = faults
                .iter()
                .filter(|(fault, _)| *fault == kind)
                .filter_map(|(_, at)| {
                    let next = seen.grants.iter().find(|(granted, _)| granted > at)?;
                    Some(next.0.duration_since(*at).as_millis())
                })
                .collect();
            gaps.sort_unstable();
            if let (Some(median), Some(max)) = (gaps.get(gaps.len() / 2), gaps.last()) {
                line.push_str(&format!("  {kind:?} {median}/{max}"));
            }
        }
        eprintln!("{line}");
        for error in seen.errors.iter().take(5) {
            failures.push(format!("{worker} saw an error: {error}"));
        }
        if seen.errors.len() > 5 {
            failures.push(format!("{worker} saw {} errors in all", seen.errors.len()));
        }
        for pair in seen.grants.windows(2) {
            if pair[1].1 <= pair[0].1 {
                failures.push(format!(
                    "{worker} was granted token {} after {}",
                    pair[1].1, pair[0].1
                ));
            }
        }
        if seen
            .grants
            .iter()
            .all(|(granted, _)| *granted < faults.last().unwrap().1)
        {
            failures.push(format!("{worker} was granted nothing after the last fault"));
        }
    }
    if let Some(Ok((at, answer))) = lost_answer {
        let after = faults
            .iter()
            .rev()
            .find(|(_, started)| *started < at)
            .map(|(fault, started)| format!("{:?} after a {fault:?} of the leader", at - *started));
        failures.push(format!(
            "the holder's lease was lost ({}): {answer:?}",
            after.unwrap_or_default()
        ));
    }
    match status {
        Ok(status) if status.holder == Some(holder_session) && status.token == Some(held) => {}
        status => failures.push(format!(
            "the held lock shows {status:?}, not session {holder_session} with token {held}"
        )),
    }
    if let Err(error) = released {
        failures.push(format!("the holder's release failed: {error:#}"));
    }
    eprintln!("the faults:\n{}", timeline.join("\n"));
    if !failures.is_empty() {
        // The failures first: CI shows the start of a long output.
        eprintln!("{}", failures.join("\n"));
        eprint!("{}", cluster.logs_tail(LOG_TAIL));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
