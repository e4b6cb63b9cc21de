//! What every run has, whichever service it drives: its arguments, the
//! worker and resource processes it starts, pausing a client, and the
//! history file. `run.rs` (a Deadbolt cluster) and `backend_run.rs` (the
//! other lock services) both build on it; it imports neither.

use crate::history::{Accepted, Line, Op, Phase, Record};
use crate::servers::{Fault, Kind};
use crate::worker::http;
use deadbolt_testkit::{free_port, signal};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
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
    pub backend: BackendArgs,
}

#[derive(clap::Args)]
pub struct BackendArgs {
    /// Run against this lock service through deadbolt-backends, started
    /// here (PostgreSQL: scripts/postgres.sh's), instead of a Deadbolt
    /// cluster through deadbolt-client.
    #[arg(long, value_enum)]
    pub backend: Option<Kind>,
    /// The fault injected over and over (see servers.rs for which backend
    /// takes which).
    #[arg(long, value_enum, default_value = "pause", requires = "backend")]
    pub fault: Fault,
    /// The resource checks no token and the workers send none: what code
    /// that ignores its lock's token suffers.
    #[arg(long, requires = "backend")]
    pub unfenced: bool,
    /// Redis and Redlock servers persist every write (appendonly yes,
    /// appendfsync always).
    #[arg(long, requires = "backend")]
    pub aof: bool,
    /// Redlock: how many independent masters.
    #[arg(long, default_value_t = 5, requires = "backend")]
    pub masters: usize,
    /// Redis failover: the replica's link to the primary is cut this long
    /// before the primary dies (a lagging replica); 0 = in sync.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration, requires = "backend")]
    pub lag: Duration,
    /// Redis failover: a Redis Sentinel detects and promotes (quorum 1,
    /// down after 1 s) instead of a scripted REPLICAOF NO ONE.
    #[arg(long, requires = "backend")]
    pub sentinel: bool,
    /// PostgreSQL's URL (default: $DEADBOLT_TEST_POSTGRES_URL).
    #[arg(long, requires = "backend")]
    pub postgres_url: Option<String>,
    /// The work each holder does between reading the resource and writing
    /// it back (the window a pause makes a late write in).
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration, requires = "backend")]
    pub hold: Duration,
    /// PostgreSQL: leave `idle_session_timeout` off (unsafe: a hung holder
    /// keeps its locks forever), to measure what it prevents.
    #[arg(long, requires = "backend")]
    pub no_idle_timeout: bool,
}

/// Where a run finds its binaries and keeps its files.
pub(crate) struct Setup {
    /// This binary: it is the workers and the resource too.
    pub(crate) me: PathBuf,
    pub(crate) deadbolt: PathBuf,
    /// Removed at the end unless kept for evidence.
    pub(crate) scratch: tempfile::TempDir,
    pub(crate) out: PathBuf,
}

impl Setup {
    pub(crate) fn new(args: &RunArgs) -> anyhow::Result<Setup> {
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
        Ok(Setup {
            me,
            deadbolt,
            scratch,
            out,
        })
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
