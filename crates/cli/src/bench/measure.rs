//! What a bench run is asked for ([`BenchArgs`]), what a lock system offers
//! the loop workloads ([`LoopSystem`]) and how they are measured
//! ([`measure`]): the part every lock system's bench shares, the Deadbolt
//! server's (`deadbolt.rs`, and the workloads of `bench.rs` and
//! `overload.rs`) and the other backends' (`backend.rs`) alike. It imports
//! none of them.

use crate::parse_duration;
use deadbolt_client::Client;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum Workload {
    Uncontended,
    Contended,
    Expiry,
    Failover,
    Overload,
    Rwlock,
    Semaphore,
    Election,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub(crate) workload: Workload,
    /// Concurrent clients, each with its own session (`overload`: the
    /// blocking waiters).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) clients: u32,
    /// Connections the clients' sessions are spread over, round robin
    /// (default: one per client). Sessions on one connection share its
    /// `Calls` stream, as the workers of one program sharing a `Client` do.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) connections: Option<u32>,
    /// `uncontended` and `contended`: how acquires, releases and
    /// keepalives go, as framed calls (on a connection of their own, where
    /// the server speaks them) or over the gRPC `Calls` stream.
    #[arg(long, value_enum, default_value_t = CallsOver::Framed)]
    pub(crate) calls: CallsOver,
    /// Measured time (after warm-up; `overload`: the flood).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) warmup: Duration,
    /// Session TTL (for `expiry`, the TTL of the holder that dies).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) ttl: Duration,
    /// Measure another lock system instead of the Deadbolt server, named
    /// by URL: redis(s)://, redlock(s)://, etcd(s)://, postgres:// (`uncontended`
    /// and `contended` only; one session per client).
    #[arg(long, value_name = "URL", conflicts_with = "connections")]
    pub(crate) backend: Option<String>,
    /// Rounds of the `expiry`, `election` and `failover` workloads.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// `failover`: shell command that kills a node; `{id}` is replaced by the
    /// leader's node id. Example: `scripts/cluster.sh kill {id}`.
    #[arg(long, required_if_eq("workload", "failover"))]
    pub(crate) kill_cmd: Option<String>,
    /// `failover`: shell command that brings the killed node back; `{id}` as
    /// above. Example: `scripts/cluster.sh start`.
    #[arg(long, required_if_eq("workload", "failover"))]
    pub(crate) restart_cmd: Option<String>,
    /// `uncontended` and `contended`: first take this many locks
    /// (`bench:fill:N`, up to 12 in a session) and hold them while
    /// measuring. The server's limits allow 1,000,000 locks and 100,000
    /// sessions in all, so 990000 fills the table.
    #[arg(long, default_value_t = 0)]
    pub(crate) fill: u64,
    /// `uncontended` and `contended`: first open this many idle sessions,
    /// with a 1 h TTL and no keepalives, and leave them open when done
    /// (they expire an hour later, so a restart or a second bench finds
    /// them). The server allows 100,000 sessions unless `deadbolt cluster
    /// limits --max-sessions` raised it.
    #[arg(long, default_value_t = 0)]
    pub(crate) fill_sessions: u64,
    /// `overload`: locks the waiters queue on (waiter i on lock i mod N).
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) locks: usize,
    /// `overload`: tasks flooding the server with unary calls (session open
    /// and close, lock status), spread over the connections.
    #[arg(long, default_value_t = 256)]
    pub(crate) flooders: usize,
    /// `overload`: the server's process id, to sample its memory from /proc
    /// (the server must run on this machine).
    #[arg(long)]
    pub(crate) server_pid: Option<u32>,
    /// `semaphore`: its permits.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) permits: u32,
    /// `uncontended`, `contended`, `rwlock`, `semaphore`: first open this
    /// many watches of every `bench:` name (over connections of their own,
    /// 100 each), and report the events they receive.
    #[arg(long, default_value_t = 0)]
    pub(crate) watchers: u32,
}

/// What `--calls` chooses between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CallsOver {
    Framed,
    Grpc,
}

/// The workload's name, as on the command line.
pub(crate) fn workload_name(workload: Workload) -> &'static str {
    match workload {
        Workload::Uncontended => "uncontended",
        Workload::Contended => "contended",
        Workload::Expiry => "expiry",
        Workload::Failover => "failover",
        Workload::Overload => "overload",
        Workload::Rwlock => "rwlock",
        Workload::Semaphore => "semaphore",
        Workload::Election => "election",
    }
}

/// Microseconds, 1 µs to an hour, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// Per-client results of a loop workload.
struct ClientStats {
    grants: u64,
    acquire_us: Histogram<u64>,
    /// `None` when the backend issues no tokens.
    tokens_ok: Option<bool>,
}

/// One acquire→release round of a loop workload.
pub(crate) struct Round {
    /// How long the acquire took.
    pub(crate) waited: Duration,
    /// The grant's token, if the lock system issues one.
    pub(crate) token: Option<u64>,
}

/// A Deadbolt server's CPU time, read from the `process_cpu_seconds_total`
/// of the node a client talks to: divided by the operations a bench made,
/// what each cost the server, a figure that holds on a noisy machine where
/// throughput alone does not (issue 33).
pub(crate) struct ServerCpu(pub(crate) Client);

impl ServerCpu {
    /// Seconds of CPU the node has used; `None` if its metrics say nothing
    /// of it (an older server) or cannot be read.
    pub(crate) async fn seconds(&self) -> Option<f64> {
        let text = self.0.node_metrics().await.ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix("process_cpu_seconds_total "))
            .and_then(|value| value.trim().parse().ok())
    }
}

/// A lock system whose loop workloads (`uncontended`, `contended`, and on
/// Deadbolt `rwlock` and `semaphore`) `deadbolt bench` measures: the
/// Deadbolt server (`deadbolt.rs`) or one a team already runs
/// (`backend.rs`). `bench::loops` drives each the same way: its clients'
/// rounds through [`measure`], then [`close`](Self::close).
pub(crate) trait LoopSystem: Send + Sync + 'static {
    type Error: Send + 'static;
    /// How many clients loop, each with its own session.
    fn clients(&self) -> usize;
    /// One round of client `client` on the lock `name`: taken, let go.
    fn round(
        &self,
        client: usize,
        name: String,
    ) -> impl std::future::Future<Output = Result<Round, Self::Error>> + Send;
    /// What the clients are spread over, for the report.
    fn over(&self) -> String;
    /// The server's CPU meter, where the system has one.
    fn server_cpu(&self) -> Option<&ServerCpu>;
    /// Ends the sessions, and whatever the run set up around them.
    fn close(self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send;
    /// Says what went wrong; the exit code to end with.
    fn report(err: &Self::Error) -> i32;
}

/// Runs one `round` per client in a loop (on its own lock, or all on one
/// when `contended`), measures after the warm-up, and prints the figures
/// (with `cpu`, also what each operation cost the server).
pub(crate) async fn measure<F, Fut, E>(
    args: &BenchArgs,
    contended: bool,
    rounds: Vec<F>,
    over: &str,
    cpu: Option<&ServerCpu>,
) -> Result<(), E>
where
    F: FnMut(String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Round, E>> + Send,
    E: Send + 'static,
{
    let measuring = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (i, mut round) in rounds.into_iter().enumerate() {
        let name = if contended {
            format!("bench:{}", workload_name(args.workload))
        } else {
            format!("bench:uncontended:{i}")
        };
        let (measuring, done, counter) = (measuring.clone(), done.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let mut stats = ClientStats {
                grants: 0,
                acquire_us: histogram(),
                tokens_ok: None,
            };
            let mut last_token = 0;
            while !done.load(Ordering::Relaxed) {
                let Round { waited, token } = round(name.clone()).await?;
                if let Some(token) = token {
                    stats.tokens_ok = Some(stats.tokens_ok.unwrap_or(true) && token > last_token);
                    last_token = token;
                }
                if measuring.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
                    stats.grants += 1;
                    stats
                        .acquire_us
                        .saturating_record(waited.as_micros() as u64);
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, E>(stats)
        }));
    }
    tokio::time::sleep(args.warmup).await;
    let cpu_before = match cpu {
        Some(cpu) => cpu.seconds().await,
        None => None,
    };
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let mut last_print = (started, 0);
    while started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_secs(1).min(args.duration)).await;
        let total = counter.load(Ordering::Relaxed);
        let (at, count) = last_print;
        eprintln!(
            "[{:>4.1}s] {total} grants, {:.0}/s",
            started.elapsed().as_secs_f64(),
            (total - count) as f64 / at.elapsed().as_secs_f64()
        );
        last_print = (Instant::now(), total);
    }
    done.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu_after = match cpu {
        Some(cpu) => cpu.seconds().await,
        None => None,
    };
    let mut all = histogram();
    let mut per_client = Vec::new();
    let mut tokens_ok = None;
    for task in tasks {
        let stats = task.await.expect("bench client panicked")?;
        all.add(&stats.acquire_us).expect("histogram add");
        per_client.push(stats.grants);
        if let Some(ok) = stats.tokens_ok {
            tokens_ok = Some(tokens_ok.unwrap_or(true) && ok);
        }
    }
    let total: u64 = per_client.iter().sum();
    let rate = total as f64 / elapsed.as_secs_f64();
    let what = if contended {
        "grants/s"
    } else {
        "acquire+release pairs/s"
    };
    println!(
        "{}: {} clients over {over}, {:.1}s: {rate:.0} {what}",
        workload_name(args.workload),
        per_client.len(),
        elapsed.as_secs_f64()
    );
    println!(
        "  acquire latency: p50 {:.2}ms  p99 {:.2}ms  p99.9 {:.2}ms  max {:.2}ms",
        all.value_at_quantile(0.5) as f64 / 1000.0,
        all.value_at_quantile(0.99) as f64 / 1000.0,
        all.value_at_quantile(0.999) as f64 / 1000.0,
        all.max() as f64 / 1000.0
    );
    let (min, max) = (
        per_client.iter().min().copied().unwrap_or(0),
        per_client.iter().max().copied().unwrap_or(0),
    );
    let sum_sq: f64 = per_client.iter().map(|&x| (x as f64).powi(2)).sum();
    let fairness = (total as f64).powi(2) / (per_client.len() as f64 * sum_sq).max(1.0);
    println!("  per-client grants: min {min}  max {max}  fairness (Jain) {fairness:.3}");
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        let used = after - before;
        let per = if contended { "grant" } else { "pair" };
        println!(
            "  server CPU: {:.0} µs per {per}, {:.0}% of a core (process_cpu_seconds_total of \
             the node answering)",
            used * 1e6 / total.max(1) as f64,
            used * 100.0 / elapsed.as_secs_f64()
        );
    }
    println!(
        "  tokens strictly increasing per client: {}",
        match tokens_ok {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "no tokens (this lock system issues none)",
        }
    );
    Ok(())
}
