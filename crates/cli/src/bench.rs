//! `deadbolt bench`: throughput and latency against a running server, with
//! the workloads of `shared/lockbench` so figures compare side by side.
//!
//! - `uncontended`: each client loops acquire→release on its own lock;
//! - `contended`: all clients loop acquire→release on one lock (FIFO);
//! - `expiry`: a holder stops renewing; how long until a waiter gets the lock;
//! - `failover`: kills the leader (with a command you give) again and again;
//!   how long from each kill until a client's next successful grant, and
//!   every error and the worst acquire the clients saw meanwhile;
//! - `overload`: thousands of blocking waiters on a few locks and a flood of
//!   unary calls; a probe's latency, the server's memory, and whether every
//!   grant was right (see `overload.rs`);
//! - `rwlock`: all clients on one read/write lock, one in ten a writer;
//! - `semaphore`: all clients on one semaphore of `--permits` permits;
//! - `election`: a leader dies (stops renewing) right after it is elected;
//!   how long until the next candidate is leader and has proclaimed.
//!
//! `--watchers N` opens N watches of every `bench:` name first and counts
//! the events they receive while the workload runs: the fan-out's cost,
//! next to the same workload without them.
//!
//! `--fill N` first takes N more locks and holds them while measuring, to
//! see what a big table costs (snapshots of it, above all).
//! `--fill-sessions N` first opens N idle sessions (no keepalives, a 1 h
//! TTL) and leaves them open, to see what many sessions cost: raise
//! `max_sessions` first (`deadbolt cluster limits --max-sessions N`).
//!
//! Every client has its own session and, by default, its own connection, as
//! in lockbench; `--connections N` spreads the sessions over N connections
//! instead, as a program whose workers share one `Client` would. The bench
//! also checks what it can see: tokens never repeat and grow with every
//! grant.
//!
//! One road for the loop workloads whichever system is measured: [`main`]
//! opens a [`LoopSystem`], the Deadbolt server (`deadbolt.rs`) or with
//! `--backend` another lock system (`backend.rs`), and [`loops`] measures
//! it (`measure.rs`) and closes it.

use crate::exit;
use crate::Endpoints;
use anyhow::Context;
use deadbolt_client::{Client, Error};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod backend;
mod deadbolt;
pub(crate) mod measure;
mod overload;

pub(crate) use measure::BenchArgs;
use measure::{histogram, measure, workload_name, LoopSystem, Workload};

pub async fn main(endpoints: &Endpoints, args: BenchArgs) -> i32 {
    let contended = match args.workload {
        Workload::Uncontended => false,
        Workload::Contended | Workload::Rwlock | Workload::Semaphore => true,
        Workload::Expiry | Workload::Election | Workload::Failover | Workload::Overload => {
            return server_workload(endpoints, &args).await;
        }
    };
    // One road whichever system is measured: its loops through `loops`.
    let opened = match &args.backend {
        Some(url) => match backend::Backends::open(url, &args).await {
            Ok(system) => Ok(loops(system, &args, contended).await),
            Err(code) => Err(code),
        },
        None => match deadbolt::Deadbolt::open(endpoints, &args).await {
            Ok(system) => Ok(loops(system, &args, contended).await),
            Err(code) => Err(code),
        },
    };
    opened.unwrap_or_else(|code| code)
}

/// `expiry`, `election`, `failover` and `overload`: workloads only a
/// Deadbolt server runs.
async fn server_workload(endpoints: &Endpoints, args: &BenchArgs) -> i32 {
    if args.backend.is_some() {
        eprintln!("deadbolt bench: {}", backend::ONLY_LOOPS);
        return exit::USAGE;
    }
    let result = match args.workload {
        Workload::Expiry | Workload::Election => {
            return match handover(endpoints, args).await {
                Ok(()) => exit::OK,
                Err(err) => exit::report(&err),
            };
        }
        Workload::Failover => failover(endpoints, args).await,
        _ => overload::overload(endpoints, args).await,
    };
    match result {
        Ok(()) => exit::OK,
        Err(err) => {
            eprintln!("deadbolt: {err:#}");
            exit::FAILURE
        }
    }
}

/// Measures `system`'s clients in a loop (see [`measure`]), then closes it.
async fn loops<S: LoopSystem>(system: S, args: &BenchArgs, contended: bool) -> i32 {
    let system = Arc::new(system);
    let rounds = (0..system.clients())
        .map(|client| {
            let system = system.clone();
            move |name: String| {
                let system = system.clone();
                async move { system.round(client, name).await }
            }
        })
        .collect();
    let over = system.over();
    if let Err(err) = measure(args, contended, rounds, &over, system.server_cpu()).await {
        return S::report(&err);
    }
    // Every round has ended, and with it every other handle on `system`.
    let system = Arc::into_inner(system).expect("no round outlives measure");
    match system.close().await {
        Ok(()) => exit::OK,
        Err(err) => S::report(&err),
    }
}

/// `expiry` and `election`: a holder (of a lock, or an election's leader)
/// dies right after its grant, round after round; how long after its TTL
/// the waiter (the next candidate, which then proclaims) takes over.
async fn handover(endpoints: &Endpoints, args: &BenchArgs) -> Result<(), Error> {
    let election = matches!(args.workload, Workload::Election);
    let what = workload_name(args.workload);
    let client = endpoints.connect().await?;
    let waiter = client.open_session(Duration::from_secs(30)).await?;
    let mut overshoots = histogram();
    for round in 0..args.rounds {
        let name = format!("bench:{what}:{round}:{}", std::process::id());
        // The holder never sends a keepalive: it "dies" right after its grant.
        let sent = Instant::now();
        let (holder, _) = client.open_session_raw(args.ttl).await?;
        let token = match election {
            true => {
                client
                    .campaign_raw(&holder, &name, "dies", false, None)
                    .await?
            }
            false => client.acquire_raw(&holder, &name, false, None).await?,
        };
        let guard = match election {
            true => {
                let leading = waiter.campaign(&name, "candidate").await?;
                leading
                    .proclaim(&format!("took over in round {}", round + 1))
                    .await?;
                leading
            }
            false => waiter.lock(&name).await?,
        };
        let handover = sent.elapsed();
        assert!(
            guard.token() > token,
            "waiter got a token not above the holder's"
        );
        guard.release().await?;
        let over = handover.saturating_sub(args.ttl);
        overshoots.saturating_record(over.as_micros() as u64);
        println!(
            "round {}: {} {:.1}ms after the holder's session opened (TTL {}, +{:.1}ms)",
            round + 1,
            match election {
                true => "the next leader proclaimed",
                false => "waiter granted",
            },
            handover.as_secs_f64() * 1000.0,
            humantime::format_duration(args.ttl),
            over.as_secs_f64() * 1000.0
        );
        if handover < args.ttl {
            println!("  LEASE ENDED EARLY: {handover:?} < TTL");
        }
    }
    waiter.close().await?;
    println!(
        "{what}: handover after TTL + p50 {:.1}ms, max {:.1}ms",
        overshoots.value_at_quantile(0.5) as f64 / 1000.0,
        overshoots.max() as f64 / 1000.0
    );
    Ok(())
}

async fn failover(endpoints: &Endpoints, args: &BenchArgs) -> anyhow::Result<()> {
    let (kill, restart) = (
        args.kill_cmd.as_deref().expect("required by clap"),
        args.restart_cmd.as_deref().expect("required by clap"),
    );
    let client = endpoints.connect().await?;
    // `--clients` probes, each on a lock of its own in a session of its
    // own, loop acquire→release, stamp every grant, time every acquire and
    // count every error: a caller with time left should see none.
    let epoch = Instant::now();
    let probes = Arc::new(FailoverProbes::default());
    let mut tasks = Vec::new();
    for id in 0..args.clients.max(1) {
        let session = client.open_session(args.ttl).await?;
        let probes = probes.clone();
        tasks.push(tokio::spawn(async move {
            let lock = format!("bench:failover:{id}");
            loop {
                let asked = Instant::now();
                let outcome = match session.lock_timeout(&lock, FAILOVER_WAIT).await {
                    Ok(guard) => {
                        probes.granted(epoch, asked.elapsed());
                        guard.release().await
                    }
                    Err(error) => Err(error),
                };
                if let Err(error) = outcome {
                    probes.failed(&error);
                }
            }
        }));
    }
    let mut times = histogram();
    for round in 0..args.rounds {
        let leader = client
            .cluster_status()
            .await?
            .leader_id
            .context("the cluster reports no leader")?;
        run_shell(kill, leader)?;
        let killed_us = epoch.elapsed().as_micros() as u64;
        // A stopping leader (SIGTERM) may still grant for a moment before
        // it stops leading: the window is the longest gap between grants
        // from the signal until another node leads and has granted.
        let took = loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let newer = client.cluster_status().await.ok().and_then(|s| s.leader_id);
            if newer.is_none_or(|id| id == leader) {
                continue;
            }
            let marked = epoch.elapsed().as_micros() as u64;
            while probes.last_grant().is_none_or(|at| at <= marked) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let gap = probes.longest_gap_since(killed_us);
            break Duration::from_micros(gap);
        };
        times.saturating_record(took.as_micros() as u64);
        println!(
            "kill {}: leader node {leader} stopped; no grant for {:.0}ms",
            round + 1,
            took.as_secs_f64() * 1000.0
        );
        run_shell(restart, leader)?;
        // Let the restarted node catch up before the next kill, so each
        // round starts from a whole cluster.
        wait_until_whole(&client, endpoints).await?;
        probes.forget_grants();
    }
    for task in tasks {
        task.abort();
    }
    let state = probes.state.lock().expect("poisoned");
    println!(
        "failover: {} stops, longest time with no grant: median {:.0}ms, max {:.0}ms",
        args.rounds,
        times.value_at_quantile(0.5) as f64 / 1000.0,
        times.max() as f64 / 1000.0
    );
    println!(
        "  {} clients: {} grants, {} errors; acquire latency p50 {:.2}ms  p99 {:.2}ms  max {:.2}ms",
        args.clients.max(1),
        state.acquire_us.len(),
        state.errors,
        state.acquire_us.value_at_quantile(0.5) as f64 / 1000.0,
        state.acquire_us.value_at_quantile(0.99) as f64 / 1000.0,
        state.acquire_us.max() as f64 / 1000.0
    );
    if let Some(error) = &state.first_error {
        println!("  first error: {error}");
    }
    Ok(())
}

/// How long a `failover` probe's acquire may wait: far past any failover,
/// so that an error is the client's, never the wait's.
const FAILOVER_WAIT: Duration = Duration::from_secs(30);

/// What the `failover` probes saw.
struct FailoverProbes {
    state: std::sync::Mutex<ProbeState>,
}

struct ProbeState {
    /// Grants since the round began, in µs since the run's epoch.
    grants_us: Vec<u64>,
    acquire_us: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Default for FailoverProbes {
    fn default() -> Self {
        FailoverProbes {
            state: std::sync::Mutex::new(ProbeState {
                grants_us: Vec::new(),
                acquire_us: histogram(),
                errors: 0,
                first_error: None,
            }),
        }
    }
}

impl FailoverProbes {
    fn granted(&self, epoch: Instant, took: Duration) {
        let mut state = self.state.lock().expect("poisoned");
        state.grants_us.push(epoch.elapsed().as_micros() as u64);
        state.acquire_us.saturating_record(took.as_micros() as u64);
    }

    fn failed(&self, error: &deadbolt_client::Error) {
        let mut state = self.state.lock().expect("poisoned");
        state.errors += 1;
        state.first_error.get_or_insert_with(|| error.to_string());
    }

    fn last_grant(&self) -> Option<u64> {
        self.state
            .lock()
            .expect("poisoned")
            .grants_us
            .last()
            .copied()
    }

    /// The longest time without a grant from `since` to the latest grant.
    fn longest_gap_since(&self, since: u64) -> u64 {
        let state = self.state.lock().expect("poisoned");
        let mut grants: Vec<u64> = state
            .grants_us
            .iter()
            .copied()
            .filter(|at| *at > since)
            .collect();
        grants.sort_unstable();
        std::iter::once(since)
            .chain(grants)
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }

    fn forget_grants(&self) {
        self.state.lock().expect("poisoned").grants_us.clear();
    }
}

/// Runs `command` with `{id}` replaced, through `sh -c`.
fn run_shell(command: &str, id: u64) -> anyhow::Result<()> {
    let command = command.replace("{id}", &id.to_string());
    let status = std::process::Command::new("sh")
        .args(["-c", &command])
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("cannot run `{command}`"))?;
    anyhow::ensure!(status.success(), "`{command}` failed: {status}");
    Ok(())
}

/// Waits until every member answers and has applied what the leader has.
async fn wait_until_whole(client: &Client, endpoints: &Endpoints) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = client.cluster_status().await?;
        let mut applied = Vec::new();
        for member in &view.members {
            let status = match endpoints.connect_one(&member.address).await {
                Ok(member) => member.cluster_status().await.ok(),
                Err(_) => None,
            };
            applied.push(status.map(|s| s.applied_index));
        }
        if applied.iter().all(|a| a.is_some() && *a == applied[0]) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the cluster did not become whole within 60s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
