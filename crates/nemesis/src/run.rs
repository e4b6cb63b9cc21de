//! `deadbolt-nemesis run`: a real cluster, client processes, a resource
//! process, and faults at random (from a seed) for a while; then the faults
//! stop, the clients must make progress again, and the checker reads the
//! history. The last line printed is `ops=N faults=N violations=N`.

use crate::availability::{self, Bearing};
use crate::checker::{check, Finals, Violation};
use crate::full_disk::FullDisk;
use crate::harness::{
    holding_clients, pause_client, spawn_worker, stop_workers, write_history, Resource, RunArgs,
    Setup, Worker,
};
use crate::history::{now, Line, Op, Phase, Record};
use crate::linearizable::check_linearizable;
use crate::watched::check_watched;
use deadbolt_client::{AclGrant, Client, WatchEvent, WatchOptions};
use deadbolt_testkit::{signal, TestCluster, TestPki};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// After the faults stop, each lock must see a completed round within this.
const LIVENESS_BOUND: Duration = Duration::from_secs(15);

pub async fn main(args: RunArgs) -> anyhow::Result<bool> {
    let Setup {
        me,
        deadbolt,
        scratch,
        out,
    } = Setup::new(&args)?;
    anyhow::ensure!(
        deadbolt.exists(),
        "no deadbolt binary at {} (build it, or pass --deadbolt)",
        deadbolt.display()
    );
    println!(
        "nemesis: seed {}, {} nodes, {} clients, {} locks, faults for {}",
        args.seed,
        args.nodes,
        args.clients,
        args.locks,
        humantime::format_duration(args.duration)
    );

    let pki = args
        .secure
        .then(|| TestPki::create(&deadbolt, &out.join("certs"), "nemesis"));
    let first_bin = args.upgrade_from.as_deref().unwrap_or(&deadbolt);
    let mut cluster =
        TestCluster::start_with(first_bin, &out.join("cluster"), args.nodes, pki).await;
    let mut locks: Vec<String> = (0..args.locks).map(|i| format!("lock-{i}")).collect();
    // A read/write lock, an election and a semaphore too, under the same
    // checks (the semaphore's with its permits and slots).
    use crate::worker::{ELECTION_PREFIX, RW_LOCK_PREFIX, SEMAPHORE_PERMITS, SEMAPHORE_PREFIX};
    locks.extend([
        format!("{RW_LOCK_PREFIX}0"),
        format!("{ELECTION_PREFIX}0"),
        format!("{SEMAPHORE_PREFIX}0"),
    ]);
    let access = match cluster.pki() {
        Some(pki) => Some(secure(&cluster, pki).await?),
        None => None,
    };
    let resource = Resource::start(&me, &out, false).await?;
    let resource_addr = resource.address;
    let watch = match (&args.upgrade_from, &access) {
        (Some(_), _) => None,
        (None, Some(access)) => Some(RunWatch::start(&access.admin)),
        (None, None) => Some(RunWatch::start(&cluster.client().await)),
    };

    let history = Arc::new(Mutex::new(Vec::<Record>::new()));
    // The workers' other lines: the errors their client library returned.
    let client_lines = Arc::new(Mutex::new(Vec::<Line>::new()));
    // How workers reach the cluster: its endpoints, and under --secure
    // their certificate and token.
    let mut connect = vec!["--endpoints".to_owned(), cluster.endpoints().join(",")];
    if let Some(access) = &access {
        connect.extend(access.worker_flags.iter().cloned());
    }
    // During an upgrade the workers take plain locks only, as operators
    // are told (docs/upgrading.md): the other kinds are new features, for
    // once the cluster version has moved. Then as many workers again join
    // on every kind.
    let first_locks: Vec<String> = match args.upgrade_from {
        Some(_) => locks.iter().filter(|l| is_plain_lock(l)).cloned().collect(),
        None => locks.clone(),
    };
    let mut workers = Vec::new();
    for id in 0..args.clients {
        workers.push(spawn_worker(
            &me,
            id,
            &connect,
            &first_locks,
            resource_addr,
            &args,
            history.clone(),
            Some(client_lines.clone()),
        )?);
    }

    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut faults = 0u64;
    let full_disk = FullDisk::new(&out);
    // What the faults themselves found (a node that stopped without
    // saying why), with the checkers' findings at the end.
    let mut fault_violations = Vec::new();
    // Every fault, when it ran and what it excuses: for the availability check.
    let mut fault_log: Vec<availability::Fault> = Vec::new();
    if let Some(previous) = &args.upgrade_from {
        faults =
            crate::upgrade::upgrade(&mut cluster, previous, &deadbolt, &mut rng, started).await?;
        for id in args.clients..2 * args.clients {
            workers.push(spawn_worker(
                &me,
                id,
                &connect,
                &locks,
                resource_addr,
                &args,
                history.clone(),
                None,
            )?);
        }
    }
    while args.upgrade_from.is_none() && started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1200))).await;
        faults += 1;
        let holding = holding_clients(&history.lock().expect("poisoned"));
        let from = now();
        let (what, bearing) = inject(
            &mut cluster,
            &mut workers,
            &holding,
            &mut rng,
            args.ttl,
            (&full_disk, &mut fault_violations),
        )
        .await;
        println!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
        fault_log.push(availability::Fault {
            from,
            to: now(),
            what,
            bearing,
        });
    }

    // Everything back up and connected; from now on clients must progress.
    cluster.heal();
    for node in 1..=args.nodes {
        if cluster.pid(node).is_none() {
            cluster.start_node(node);
        }
    }
    let healed_at = now();
    tokio::task::block_in_place(|| cluster.wait_for_leader(Duration::from_secs(30)));
    println!(
        "[{:>5.1}s] faults stopped; clients run on for {}s",
        started.elapsed().as_secs_f64(),
        LIVENESS_BOUND.as_secs()
    );
    tokio::time::sleep(LIVENESS_BOUND).await;
    stop_workers(&mut workers).await;

    let client = match &access {
        Some(access) => access.admin.clone(),
        None => cluster.client().await,
    };
    let mut finals = Finals {
        store: BTreeMap::new(),
        resource: BTreeMap::new(),
        audit: BTreeMap::new(),
        semaphores: locks
            .iter()
            .filter(|name| name.starts_with(SEMAPHORE_PREFIX))
            .map(|name| (name.clone(), SEMAPHORE_PERMITS))
            .collect(),
    };
    for lock in &locks {
        let stored = client.store_get(&format!("counter:{lock}"), None).await?;
        let value = stored.value.as_deref().unwrap_or("0").parse()?;
        finals.store.insert(lock.clone(), value);
        finals
            .audit
            .insert(lock.clone(), client.lock_history(lock).await?);
    }
    finals.resource = resource.finals(&locks).await?;
    let accepted = resource.stop()?;

    let mut history = std::mem::take(&mut *history.lock().expect("poisoned"));
    history.sort_by_key(|r| r.at);
    write_history(&out.join("history.jsonl"), &history)?;
    let mut violations = check(
        &history,
        &accepted,
        &finals,
        healed_at,
        LIVENESS_BOUND.as_nanos() as u64,
    );
    violations.extend(check_linearizable(&history, &finals));
    let client_errors: Vec<availability::ClientError> =
        std::mem::take(&mut *client_lines.lock().expect("poisoned"))
            .into_iter()
            .filter_map(|line| match line {
                Line::ClientError { client_error } => Some(client_error),
                _ => None,
            })
            .collect();
    let grants: Vec<u64> = history
        .iter()
        .filter(|r| r.op == Op::Acquire && r.phase == Phase::Ok)
        .map(|r| r.at)
        .collect();
    let (served, unserved) =
        availability::check(&client_errors, &grants, &fault_log, nanos(args.max_gap));
    violations.extend(unserved);
    violations.extend(fault_violations);
    if let Some(watch) = watch {
        let (watched, ended) = watch.finish(&finals.audit).await;
        println!("watch: {} events received across the faults", watched.len());
        violations.extend(check_watched(&finals.audit, &watched, ended.as_deref()));
    }
    for violation in &violations {
        print!("{violation}");
    }
    let ops = history.iter().filter(|r| r.phase != Phase::Invoke).count();
    let acked = history.iter().filter(|r| r.phase == Phase::Ok).count();
    println!(
        "final counters: store {:?}, resource {:?}; {acked} operations acknowledged",
        finals.store, finals.resource
    );
    if !violations.is_empty() && args.out.is_none() {
        // Keep the evidence.
        let kept = scratch.keep();
        println!("history and logs kept in {}", kept.display());
    }
    let (median, longest) = served.gap_figures().unwrap_or_default();
    println!(
        "availability: {} outage errors shown to clients while a majority was up ({} more \
         excused by faults that left none, or paused the client, {} on leases a fault \
         outlasted; {} changes left of unknown outcome); after each of {} node \
         faults, the longest time without a grant: median {median} ms, max {longest} ms \
         (bound {} ms)",
        served.unexcused.len(),
        served.excused,
        served.lease_lost,
        served.outcome_unknown,
        served.gaps.len(),
        args.max_gap.as_millis()
    );
    println!("ops={ops} faults={faults} violations={}", violations.len());
    Ok(violations.is_empty())
}

/// Whether `lock` is a plain lock of the run, not a read/write lock, an
/// election or a semaphore.
fn is_plain_lock(lock: &str) -> bool {
    use crate::worker::{ELECTION_PREFIX, RW_LOCK_PREFIX, SEMAPHORE_PREFIX};
    ![RW_LOCK_PREFIX, ELECTION_PREFIX, SEMAPHORE_PREFIX]
        .iter()
        .any(|prefix| lock.starts_with(prefix))
}

/// One watch of every lock of the run, from the log's start and through
/// every fault: what it receives must be the service's audit trail (see
/// the checker's `watched.rs`).
struct RunWatch {
    events: Arc<Mutex<Vec<WatchEvent>>>,
    ended: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

/// How long the watch may take to catch up once the run is over.
const WATCH_CATCH_UP: Duration = Duration::from_secs(30);

impl RunWatch {
    fn start(client: &Client) -> RunWatch {
        let options = WatchOptions {
            prefix: true,
            after: Some("0".to_owned()),
        };
        let mut watch = client.watch("lock-", options);
        let events: Arc<Mutex<Vec<WatchEvent>>> = Arc::default();
        let ended: Arc<Mutex<Option<String>>> = Arc::default();
        let (into, end) = (events.clone(), ended.clone());
        let task = tokio::spawn(async move {
            while let Some(event) = watch.next().await {
                match event {
                    Ok(event) => into.lock().expect("poisoned").push(event),
                    Err(err) => *end.lock().expect("poisoned") = Some(err.to_string()),
                }
            }
        });
        RunWatch {
            events,
            ended,
            task,
        }
    }

    /// Waits until the watch has as many of each lock's changes as its
    /// trail (or it ended, or [`WATCH_CATCH_UP`] passed); then stops it.
    async fn finish(
        self,
        audit: &BTreeMap<String, Vec<deadbolt_client::AuditEntry>>,
    ) -> (Vec<WatchEvent>, Option<String>) {
        let caught_up = || {
            let events = self.events.lock().expect("poisoned");
            audit.iter().all(|(lock, trail)| {
                let changes = events
                    .iter()
                    .filter(|e| e.name == *lock)
                    .filter(|e| !matches!(e.kind.as_str(), "queued" | "left_queue" | "proclaimed"))
                    .count();
                changes >= trail.len()
            })
        };
        let started = Instant::now();
        while !caught_up() && self.ended.lock().expect("poisoned").is_none() {
            if started.elapsed() > WATCH_CATCH_UP {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.task.abort();
        let events = std::mem::take(&mut *self.events.lock().expect("poisoned"));
        let ended = self.ended.lock().expect("poisoned").take();
        (events, ended)
    }
}

/// What `--secure` gives the run: a client with the root token, for the
/// final reads, and the workers' flags (their certificate and a token of
/// identity `worker`, allowed only the run's locks and counters).
struct Access {
    admin: Client,
    worker_flags: Vec<String>,
}

/// Turns access control on (the bootstrap arrives over mutual TLS, like
/// everything else) and makes the workers' role and token.
async fn secure(cluster: &TestCluster, pki: &TestPki) -> anyhow::Result<Access> {
    let tls = pki.tls_options();
    let root = cluster.client().await.acl_bootstrap().await?.token;
    let admin = Client::connect_with_token(cluster.endpoints(), &tls, Some(&root)).await?;
    let grants = [
        ("lock", "lock-"),
        ("read", "lock-"),
        ("store-read", "counter:"),
        ("store-write", "counter:"),
    ]
    .map(|(permission, prefix)| AclGrant {
        permission: permission.into(),
        prefix: prefix.into(),
    });
    admin.acl_put_role("worker", grants.to_vec()).await?;
    admin.acl_bind_role("worker", "worker", true).await?;
    let token = admin.acl_create_token("worker").await?.token;
    let mut worker_flags = pki.client_flags();
    worker_flags.extend(["--access-token".to_owned(), token]);
    println!("nemesis: mutual TLS, access control on; workers run as identity \"worker\"");
    Ok(Access {
        admin,
        worker_flags,
    })
}

/// Injects one fault, waits its length, and undoes it. Returns what it did.
async fn inject(
    cluster: &mut TestCluster,
    workers: &mut [Worker],
    holding: &[usize],
    rng: &mut StdRng,
    ttl: Duration,
    (full_disk, violations): (&FullDisk, &mut Vec<Violation>),
) -> (String, Bearing) {
    let nodes: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    let leader = tokio::task::block_in_place(|| cluster.agreed_leader());
    // The leader half the time, when there is one: the interesting victim.
    let victim = match leader {
        Some(leader) if rng.gen_bool(0.5) => leader,
        _ => nodes[rng.gen_range(0..nodes.len())],
    };
    let role = if Some(victim) == leader {
        " (leader)"
    } else {
        ""
    };
    let kept = |what: String| (what, Bearing::Kept);
    match rng.gen_range(0..6) {
        0 => {
            cluster.kill9(victim);
            let down = Duration::from_millis(rng.gen_range(300..2000));
            tokio::time::sleep(down).await;
            cluster.start_node(victim);
            kept(format!(
                "kill -9 node {victim}{role}; restarted after {down:?}"
            ))
        }
        1 => {
            let pid = cluster.pid(victim).expect("running");
            let pause = Duration::from_millis(rng.gen_range(300..1500));
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(pause).await;
            signal(pid, libc::SIGCONT);
            kept(format!("SIGSTOP node {victim}{role} for {pause:?}"))
        }
        2 => {
            let cut = Duration::from_millis(rng.gen_range(500..3000));
            cluster.isolate(victim);
            tokio::time::sleep(cut).await;
            cluster.heal();
            kept(format!(
                "partition: node {victim}{role} cut off from the others for {cut:?}"
            ))
        }
        3 => {
            let Some(faketime) = faketime_library() else {
                return kept("clock fault skipped: libfaketime is not installed".to_owned());
            };
            // Far beyond the 2% drift the lease model allows: the node may
            // expire leases early as leader. Fencing must still hold.
            let rate = rng.gen_range(1.2..2.0);
            let preload = faketime.display().to_string();
            let speed = format!("+0 x{rate:.2}");
            cluster.kill9(victim);
            cluster.start_node_with_env(victim, &[("LD_PRELOAD", &preload), ("FAKETIME", &speed)]);
            let fast = Duration::from_millis(rng.gen_range(1000..4000));
            tokio::time::sleep(fast).await;
            cluster.kill9(victim);
            cluster.start_node(victim);
            kept(format!("clock: node {victim}{role} restarted with its clocks running {rate:.2}x fast for {fast:?}"))
        }
        4 => {
            // Every node's disk a quarter of the time: then no node can
            // write, and service must come back with the space.
            let every = rng.gen_bool(0.25);
            let (victims, label) = if every {
                (nodes, "every node".to_owned())
            } else {
                (vec![victim], format!("node {victim}{role}"))
            };
            let what = full_disk
                .inject(cluster, (&victims, &label), rng, violations)
                .await;
            // With every disk full no node can write: service comes back
            // once space does, the nodes' waiting writes go through and
            // they elect a leader.
            let grace = nanos(SPACE_BACK_GRACE);
            (
                what,
                if every {
                    Bearing::NoMajority { grace }
                } else {
                    Bearing::Kept
                },
            )
        }
        _ => {
            let (what, paused) = pause_client(workers, holding, rng, ttl).await;
            // Its lease is rightly gone: its own errors until it has a new
            // session are answers to that.
            let bearing = match paused {
                Some(client) => Bearing::Client {
                    client,
                    grace: nanos(ttl * 2),
                },
                None => Bearing::Kept,
            };
            (what, bearing)
        }
    }
}

/// After space came back to every node (a full disk on each), how long
/// until a leader serves: the waiting writes go through, the nodes elect
/// and apply.
const SPACE_BACK_GRACE: Duration = Duration::from_secs(5);

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// libfaketime's multi-threaded build, where Debian's package puts it.
fn faketime_library() -> Option<PathBuf> {
    let path = PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1");
    path.exists().then_some(path)
}
