//! `deadbolt-nemesis run`: a real cluster, client processes, a resource
//! process, and faults at random (from a seed) for a while; then the faults
//! stop, the clients must make progress again, and the checker reads the
//! history. The last line printed is `ops=N faults=N violations=N`.

use crate::availability::{self, Bearing};
use crate::checker::{check, Finals, Violation};
use crate::full_disk::FullDisk;
use crate::history::{now, Accepted, Line, Op, Phase, Record};
use crate::linearizable::check_linearizable;
use crate::watched::check_watched;
use crate::worker::http;
use deadbolt_client::{AclGrant, Client, WatchEvent, WatchOptions};
use deadbolt_testkit::{free_port, signal, TestCluster, TestPki};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

#[derive(clap::Args)]
pub struct RunArgs {
    /// How long faults are injected (the run takes about 20 s more).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Seeds the choice and timing of faults, and the clients.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    #[arg(long, default_value_t = 3)]
    pub(crate) nodes: u64,
    #[arg(long, default_value_t = 6)]
    pub(crate) clients: usize,
    #[arg(long, default_value_t = 2)]
    pub(crate) locks: usize,
    /// The clients' session TTL; client pauses last 1.5 to 3 times this.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) ttl: Duration,
    /// The longest time without any grant after a fault that left a
    /// majority up, before the run fails: the dead leader's lease and an
    /// election (0.5-0.7 s at the default timeouts), a forwarding node's wait
    /// for the new leader, and the clients' retry pause (at most 1 s), with
    /// room for a debug build on a loaded 2-core machine.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) max_gap: Duration,
    /// The `deadbolt` binary (default: next to this one).
    #[arg(long)]
    pub(crate) deadbolt: Option<PathBuf>,
    /// Keep the history, the resource's log and the node logs here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Run the cluster over mutual TLS with access control on: the clients
    /// use a least-privilege token, so every fault also exercises the
    /// certificates and the replicated rules (a token made before a leader
    /// change must keep working after it).
    #[arg(long, conflicts_with = "backend")]
    pub(crate) secure: bool,
    /// A rolling upgrade, and a rollback, instead of random faults: the
    /// cluster starts on this `deadbolt`, the previous release
    /// (`scripts/previous-release.sh` builds it), and is upgraded to
    /// `--deadbolt` one node at a time as docs/upgrading.md says. The
    /// watch's check is left out: the previous release has no watches.
    #[arg(long, conflicts_with_all = ["backend", "secure"])]
    pub(crate) upgrade_from: Option<PathBuf>,
    #[command(flatten)]
    pub backend: crate::backend_run::BackendArgs,
}

/// After the faults stop, each lock must see a completed round within this.
const LIVENESS_BOUND: Duration = Duration::from_secs(15);

pub async fn main(args: RunArgs) -> anyhow::Result<bool> {
    let me = std::env::current_exe()?;
    let deadbolt = args
        .deadbolt
        .clone()
        .unwrap_or_else(|| me.with_file_name("deadbolt"));
    let scratch = tempfile::tempdir()?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| scratch.path().to_owned());
    std::fs::create_dir_all(&out)?;
    if args.backend.backend.is_some() {
        return crate::backend_run::main(&args, &me, &deadbolt, &out, scratch).await;
    }
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
         excused by faults that left none, or paused the client); after each of {} node \
         faults, the longest time without a grant: median {median} ms, max {longest} ms \
         (bound {} ms)",
        served.unexcused.len(),
        served.excused,
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

pub(crate) struct Worker {
    pub(crate) child: Child,
    reader: Option<tokio::task::JoinHandle<()>>,
}

/// Closes the workers' stdin (they finish their round and exit), kills
/// those still running 15 s later, and waits for their last records.
pub(crate) async fn stop_workers(workers: &mut [Worker]) {
    for worker in workers.iter_mut() {
        drop(worker.child.stdin.take());
    }
    for worker in workers.iter_mut() {
        if tokio::time::timeout(Duration::from_secs(15), worker.child.wait())
            .await
            .is_err()
        {
            let _ = worker.child.start_kill();
        }
        if let Some(reader) = worker.reader.take() {
            let _ = reader.await;
        }
    }
}

/// The resource process (`deadbolt-nemesis resource`) and its log of
/// accepted writes.
pub(crate) struct Resource {
    child: Child,
    pub(crate) address: SocketAddr,
    accepted: PathBuf,
}

impl Resource {
    pub(crate) async fn start(me: &Path, out: &Path, unfenced: bool) -> anyhow::Result<Resource> {
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let accepted = out.join("accepted.jsonl");
        let mut command = Command::new(me);
        command
            .args(["resource", "--listen", &address.to_string(), "--accepted"])
            .arg(&accepted)
            .kill_on_drop(true);
        if unfenced {
            command.arg("--unfenced");
        }
        let child = command.spawn()?;
        wait_for_port(address).await?;
        Ok(Resource {
            child,
            address,
            accepted,
        })
    }

    /// Each lock's counter, read without a token.
    pub(crate) async fn finals(&self, locks: &[String]) -> anyhow::Result<BTreeMap<String, u64>> {
        let mut finals = BTreeMap::new();
        for lock in locks {
            let (_, body) = http(self.address, "GET", &format!("/final/{lock}"), None, "").await?;
            finals.insert(lock.clone(), body.trim().parse()?);
        }
        Ok(finals)
    }

    /// Stops it; returns the writes it accepted, in order.
    pub(crate) fn stop(mut self) -> anyhow::Result<Vec<Accepted>> {
        let _ = self.child.start_kill();
        let accepted = std::fs::read_to_string(&self.accepted)?
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        Ok(accepted)
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

/// Starts worker `id`; its records go to `history`, and its holding
/// intervals and write timings (backend runs) to `extra`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_worker(
    me: &Path,
    id: usize,
    connect: &[String],
    locks: &[String],
    resource: SocketAddr,
    args: &RunArgs,
    history: Arc<Mutex<Vec<Record>>>,
    extra: Option<Arc<Mutex<Vec<Line>>>>,
) -> anyhow::Result<Worker> {
    let mut child = Command::new(me)
        .args(["worker", "--id", &id.to_string()])
        .args(connect)
        .args(["--locks", &locks.join(",")])
        .args(["--resource", &resource.to_string()])
        .args(["--ttl", &humantime::format_duration(args.ttl).to_string()])
        .args(["--seed", &(args.seed * 1000 + id as u64).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        // A group of its own: were the runner's group orphaned (its
        // launcher gone) while a worker is SIGSTOPped, the kernel would
        // SIGHUP the whole group, runner included.
        .process_group(0)
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let reader = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            match serde_json::from_str::<Line>(&line) {
                Ok(Line::Record(record)) => history.lock().expect("poisoned").push(record),
                Ok(line) => {
                    if let Some(extra) = &extra {
                        extra.lock().expect("poisoned").push(line);
                    }
                }
                Err(_) => {}
            }
        }
    });
    Ok(Worker {
        child,
        reader: Some(reader),
    })
}

/// Clients that hold a lock right now, as far as their records tell: they
/// have been granted and not yet asked to release.
pub(crate) fn holding_clients(history: &[Record]) -> Vec<usize> {
    let mut holding = BTreeMap::new();
    for record in history {
        match (record.op, record.phase) {
            (Op::Acquire, Phase::Ok) => {
                holding.insert(record.client, true);
            }
            (Op::Release, Phase::Invoke) => {
                holding.insert(record.client, false);
            }
            _ => {}
        }
    }
    holding
        .into_iter()
        .filter(|(_, held)| *held)
        .map(|(client, _)| client)
        .collect()
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
            // once the nodes restart with space and elect a leader.
            let grace = nanos(RESTART_GRACE);
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

/// After every node restarted (a full disk on each), how long until a
/// leader serves: the processes start, elect, and apply their logs.
const RESTART_GRACE: Duration = Duration::from_secs(5);

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// SIGSTOPs a client for 1.5 to 3 times its lease, preferably one that
/// holds a lock (the paused-holder scenario), as a GC pause or a stalled
/// VM freezes a process with its sockets open.
pub(crate) async fn pause_client(
    workers: &mut [Worker],
    holding: &[usize],
    rng: &mut StdRng,
    ttl: Duration,
) -> (String, Option<usize>) {
    let index = if holding.is_empty() {
        rng.gen_range(0..workers.len())
    } else {
        holding[rng.gen_range(0..holding.len())]
    };
    let pause = ttl.mul_f64(rng.gen_range(1.5..3.0));
    let Some(pid) = workers[index].child.id() else {
        return (format!("client {index} has exited; nothing to pause"), None);
    };
    signal(pid as i32, libc::SIGSTOP);
    tokio::time::sleep(pause).await;
    signal(pid as i32, libc::SIGCONT);
    let what = format!("SIGSTOP client {index} for {pause:?} (its lease is {ttl:?})");
    (what, Some(index))
}

/// libfaketime's multi-threaded build, where Debian's package puts it.
fn faketime_library() -> Option<PathBuf> {
    let path = PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1");
    path.exists().then_some(path)
}

pub(crate) async fn wait_for_port(address: SocketAddr) -> anyhow::Result<()> {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    anyhow::bail!("nothing listens on {address}")
}

pub(crate) fn write_history(path: &Path, history: &[Record]) -> anyhow::Result<()> {
    let lines: Vec<String> = history
        .iter()
        .map(|r| serde_json::to_string(r).expect("serializable"))
        .collect();
    std::fs::write(path, lines.join("\n") + "\n")?;
    Ok(())
}
