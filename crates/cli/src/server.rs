//! `deadbolt server`: starts a node and runs it until SIGTERM or ctrl-c.

use crate::exit;
use crate::parse_duration;

use deadbolt_server::{
    ConnectionLimits, FeatureLevel, InitialCluster, QueueLimits, RaftTiming, Server, ServerConfig,
    StartMembership, TlsFiles,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Read any of these flags from a TOML file (`listen = "..."`,
    /// `election-timeout = "300ms"`, `join = true`). A flag on the command
    /// line wins over its environment variable, which wins over the file.
    #[arg(long, env = "DEADBOLT_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address for both the gRPC and the HTTP API.
    #[arg(long, default_value = "127.0.0.1:7070", env = "DEADBOLT_LISTEN")]
    listen: SocketAddr,
    /// Where the Raft log and snapshots live. Created if missing; a
    /// directory of another program is refused.
    #[arg(long, default_value = "./deadbolt-data", env = "DEADBOLT_DATA_DIR")]
    data_dir: PathBuf,
    /// This node's id in the cluster.
    #[arg(long, default_value_t = 1)]
    node_id: u64,
    /// Form a new cluster of these nodes: `1=HOST:PORT,2=HOST:PORT,...`,
    /// each node's address for clients and peers (this node's entry is the
    /// address the others reach it at). Start every listed node with the
    /// same list; the lowest id forms the cluster once all have started.
    /// Ignored once the data directory holds a cluster. Without it (and
    /// without --join) a node with empty data forms a single-node cluster.
    #[arg(long, env = "DEADBOLT_INITIAL_CLUSTER", value_parser = parse_initial_cluster)]
    initial_cluster: Option<InitialCluster>,
    /// Start with an empty data directory and wait to be added to a running
    /// cluster with `deadbolt cluster add ID HOST:PORT`.
    #[arg(long, conflicts_with = "initial_cluster")]
    join: bool,
    /// Snapshot the lock table and compact the Raft log every N entries.
    #[arg(long, default_value_t = ServerConfig::DEFAULT_SNAPSHOT_EVERY, value_parser = clap::value_parser!(u64).range(10..))]
    snapshot_every: u64,
    /// How often the leader sends heartbeats to the other nodes.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// A follower that hears no heartbeat for this long (up to twice as long,
    /// at random) stands for election. Failover takes about this plus an
    /// election round. At least 3 heartbeat intervals; raise both on slow
    /// networks or disks, or leaders are voted out for being slow.
    #[arg(long, default_value = "150ms", value_parser = parse_duration)]
    election_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog until
    /// one ends. At start the node raises its soft open-file limit to the
    /// hard one, and lowers this to what that limit leaves (saying so).
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT.max_connections)]
    max_connections: usize,
    /// Connections the kernel queues before they are accepted (capped by
    /// net.core.somaxconn).
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT.backlog)]
    listen_backlog: u32,
    /// A connection must send its first bytes, and an HTTP/1.1 request its
    /// whole head, within this; slower ones are closed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    header_read_timeout: Duration,
    /// An HTTP API request body that stalls this long is answered 408.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    body_read_timeout: Duration,
    /// Concurrent gRPC calls (HTTP/2 streams) per connection.
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT.max_streams_per_connection)]
    max_streams_per_connection: u32,
    /// Calls in flight at once per identity (a token's or certificate's
    /// name; all anonymous callers count as one), blocking acquires
    /// included; more are refused with limit_reached.
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT.max_calls_per_identity)]
    max_calls_per_identity: usize,
    /// Commands the leader queues for the Raft log; past this (or 64 MiB of
    /// them), new work (acquires, session opens, store writes) is refused
    /// with overloaded, and clients retry after a backoff. Releases,
    /// keepalives and lease expiries are never refused.
    #[arg(long, default_value_t = QueueLimits::DEFAULT.max_commands, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_queued_commands: usize,
    /// This node's certificate (PEM). With --tls-key, clients and peers
    /// must speak TLS to it. SIGHUP reloads the TLS files.
    #[arg(
        long,
        env = "DEADBOLT_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(
        long,
        env = "DEADBOLT_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// Require a certificate signed by this CA (PEM) from every client and
    /// peer (mutual TLS); a cluster's nodes also check each other's with it.
    #[arg(
        long,
        env = "DEADBOLT_TLS_CLIENT_CA",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,
    /// Only node certificates with these common names may speak Raft to
    /// this node (comma-separated; default: any node certificate the
    /// --tls-client-ca signed), as etcd's --peer-cert-allowed-cn.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "NAME,...",
        requires = "tls_client_ca"
    )]
    peer_names: Vec<String>,
    /// Serve plain text on a non-loopback --listen address: no encryption,
    /// no authentication. Only on a network you trust completely.
    #[arg(long, conflicts_with = "tls_cert")]
    insecure: bool,
    /// Without TLS, the cluster secret file the nodes prove to each other
    /// they are peers with (`deadbolt peer-secret new FILE` makes one; the
    /// same file on every node, mode 0600). Needed by every node of a
    /// plain-text cluster. SIGHUP reloads it.
    #[arg(
        long,
        env = "DEADBOLT_PEER_SECRET_FILE",
        value_name = "FILE",
        conflicts_with = "tls_cert"
    )]
    peer_secret_file: Option<PathBuf>,
    /// The highest feature level this node says it supports (default: this
    /// release's newest). The cluster version moves up only to a level
    /// every member supports, and never back; once it moves, the previous
    /// release can no longer run on this node's data. Start every node with
    /// the level it had before an upgrade to keep a rollback possible
    /// (docs/upgrading.md), and drop the flag once the new release is kept.
    #[arg(
        long,
        env = "DEADBOLT_MAX_FEATURE_LEVEL",
        value_name = "LEVEL",
        default_value_t = FeatureLevel::NEWEST.0,
        value_parser = clap::value_parser!(u32).range(i64::from(FeatureLevel::BASE.0)..=i64::from(FeatureLevel::NEWEST.0))
    )]
    max_feature_level: u32,
    /// Threads that serve the network, run Raft and write the log. One, the
    /// default, runs the node on a single thread, as Redis does: a call is
    /// handed between tasks, never between threads, and the log is fsync'd
    /// on that thread, which costs a third less CPU per call than two
    /// threads on a two-core machine (bench/results/2026-12-05.md); the
    /// node answers nothing while an fsync runs. More threads spread TLS and
    /// HTTP/2 over more cores and fsync on threads of their own, at more
    /// CPU per call.
    #[arg(long, env = "DEADBOLT_THREADS", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// `text` for people, `json` (one object a line) for log shippers.
    #[arg(long, value_enum, default_value = "text", env = "DEADBOLT_LOG_FORMAT")]
    log_format: LogFormat,
}

/// How many tasks the one-thread runtime runs before it looks at the
/// network again while tasks are still waiting (tokio's default is 61).
/// After a batch commits, each of its callers' connections is a task that
/// writes an answer; the next batch is taken after the next look at the
/// network. Polled every 61 tasks, the network gave that batch only the
/// clients answered first, and the batches split the clients into more,
/// smaller groups, each paying for a log append. At 1024 (the proposer's
/// `MAX_BATCH`) the node writes every answer first, as a Redis event loop
/// does before its next `epoll_wait`. Alternating with 61, same build,
/// lockbench uncontended: at 256 clients 18 runs of 21 did more pairs/s
/// (median +10 %; a log append carried a median 52 pairs instead of 43),
/// at 64 clients 9 of 10 (+9 %; 21 pairs instead of 17.5); at 16 clients,
/// 9 of 14 did fewer (median -6 %); bench/results/2026-12-06.md. Under
/// full load a timer or a read waits at most 1024 tasks, a few
/// milliseconds.
const TASKS_BETWEEN_NETWORK_POLLS: u32 = 1024;

impl ServerArgs {
    /// The runtime the server runs on (see `--threads`).
    pub fn runtime(&self) -> tokio::runtime::Builder {
        if self.threads == 1 {
            let mut builder = tokio::runtime::Builder::new_current_thread();
            builder.event_interval(TASKS_BETWEEN_NETWORK_POLLS);
            builder
        } else {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(self.threads.into());
            builder
        }
    }
}

/// Turns transparent huge pages off for the server's process, as Redis
/// does for its own (`disable-thp yes`). mimalloc (see `ALLOCATOR` in
/// `main.rs`) asks for huge pages on its arenas and hands memory it has not
/// used for a second back to the kernel; using it again then faulted in a
/// whole 2 MiB page, which the kernel zeroes. Under lockbench at 256
/// clients that zeroing took 2.0-2.7 % of the server's CPU, and 0.1 %
/// with huge pages off, with less RSS (104-110 MB against 112-119;
/// `bench/results/2026-12-06.md`). The flag is inherited by child
/// processes, so only the server sets it: `deadbolt run`'s children are the
/// user's.
fn keep_to_small_pages() {
    if let Err(err) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(%err, "cannot turn transparent huge pages off for this process");
    }
}

pub async fn main(args: ServerArgs) -> i32 {
    init_logging(args.log_format);
    keep_to_small_pages();
    let config = ServerConfig {
        node_id: args.node_id,
        listen: args.listen,
        data_dir: args.data_dir,
        snapshot_every: args.snapshot_every,
        timing: RaftTiming {
            heartbeat: args.heartbeat_interval,
            election_timeout: args.election_timeout,
        },
        limits: ConnectionLimits {
            max_connections: args.max_connections,
            backlog: args.listen_backlog,
            header_read_timeout: args.header_read_timeout,
            body_read_timeout: args.body_read_timeout,
            max_streams_per_connection: args.max_streams_per_connection,
            max_calls_per_identity: args.max_calls_per_identity,
        },
        queue: QueueLimits {
            max_commands: args.max_queued_commands,
            ..QueueLimits::DEFAULT
        },
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: args.tls_client_ca,
                peer_names: args.peer_names,
            }),
            _ => None,
        },
        insecure: args.insecure,
        peer_secret_file: args.peer_secret_file,
        feature_level: FeatureLevel(args.max_feature_level),
        membership: match (args.initial_cluster, args.join) {
            (Some(cluster), _) => StartMembership::Initial(cluster),
            (None, true) => StartMembership::Join,
            (None, false) => StartMembership::SingleNode,
        },
    };
    let server = match Server::start(config).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!("deadbolt server: {err:#}");
            return exit::FAILURE;
        }
    };
    match server
        .serve(async {
            crate::stop_signal().await;
        })
        .await
    {
        Ok(()) => exit::OK,
        Err(err) => {
            eprintln!("deadbolt server: {err:#}");
            exit::FAILURE
        }
    }
}

fn parse_initial_cluster(text: &str) -> Result<InitialCluster, String> {
    text.parse()
}

/// How the server writes its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn".into());
    // Colours only for a person at a terminal, not in a log file.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if format == LogFormat::Json {
        builder.json().init();
    } else {
        builder.init();
    }
}
