//! `deadbolt`: one binary for the server, the lock commands, and the bench.
//!
//! Exit codes are part of the interface (scripts and cron wrappers branch on
//! them); see [`exit`].

mod acl;
mod backends;
mod bench;
mod certs;
mod cluster;
mod config;
mod data;
mod demo;
mod exit;
mod guard;
mod locks;
mod peer_secret;
mod run;
mod semaphore;
mod server;
mod snapshot;
mod store;
mod watch;

use clap::{Parser, Subcommand};
use deadbolt_client::{Client, TlsOptions};
use mimalloc::MiMalloc;
use std::path::PathBuf;
use std::time::Duration;

const AFTER_HELP: &str = "\
Exit codes:
  0     success (for `run`: the command's own exit code is returned,
        128+N if it died of signal N)
  126   `run`: the command was found but could not be started
  127   `run`: the command was not found
  75    the lock is busy, the wait for it timed out, or the server is
        overloaded: try again later
  76    the lock was lost (the lease could not be renewed) while running,
        or a token is stale or a session unknown (release, keepalive,
        store put/get/delete, check)
  77    not permitted: no valid access token or certificate, no permission
        for this lock or key, or another client's session
  69    the Deadbolt server could not be reached
  1     any other error (bad input, refused request), with a message
  2     invalid command line";

#[derive(Parser)]
#[command(
    name = "deadbolt",
    version = long_version(),
    about = "A Raft-backed distributed lock service with fencing tokens",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Server address(es), comma-separated. One node of a cluster is enough (a follower forwards calls to the leader, or names it and the CLI goes there); give every node's to get in while one is down.
    #[arg(
        long,
        global = true,
        env = "DEADBOLT_ENDPOINT",
        default_value = "http://127.0.0.1:7070",
        value_delimiter = ','
    )]
    endpoint: Vec<String>,

    /// The CA certificate (PEM) that signed the servers' certificates; turns
    /// bare endpoints into https://.
    // Ids of their own: `store put KEY` has a `key` already.
    #[arg(
        id = "client_ca",
        long = "ca",
        global = true,
        env = "DEADBOLT_CA",
        value_name = "FILE"
    )]
    ca: Option<PathBuf>,
    /// This client's certificate (PEM), for servers that require one.
    #[arg(
        id = "client_cert",
        long = "cert",
        global = true,
        env = "DEADBOLT_CERT",
        value_name = "FILE"
    )]
    cert: Option<PathBuf>,
    /// The key of --cert (PEM).
    #[arg(
        id = "client_key",
        long = "key",
        global = true,
        env = "DEADBOLT_KEY",
        value_name = "FILE"
    )]
    key: Option<PathBuf>,
    /// The access token to send with every call (from `deadbolt acl
    /// bootstrap` or `deadbolt acl token create`), for a cluster with
    /// access control on. Prefer the environment variable: a flag shows in
    /// `ps`. (Not a fencing token: those are `--token`.)
    #[arg(
        long,
        global = true,
        env = "DEADBOLT_ACCESS_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    access_token: Option<String>,

    #[command(subcommand)]
    command: Command,
}

/// Where the servers are and how to reach them: what every client command
/// connects with.
pub struct Endpoints {
    urls: Vec<String>,
    tls: TlsOptions,
    access_token: Option<String>,
}

impl Endpoints {
    pub async fn connect(&self) -> Result<Client, deadbolt_client::Error> {
        let token = self.access_token.as_deref();
        Client::connect_with_token(self.urls.iter().cloned(), &self.tls, token).await
    }

    /// [`connect`](Self::connect), trying again while no endpoint answers
    /// until `patience` has passed: a command told to wait (`--wait`) waits
    /// through a node's restart too, as it would for a leader's election
    /// once connected. Without `patience`, one try.
    pub async fn connect_within(
        &self,
        patience: Option<std::time::Duration>,
    ) -> Result<Client, deadbolt_client::Error> {
        let give_up = patience.and_then(|patience| std::time::Instant::now().checked_add(patience));
        // Spaced as the client spaces its repeats during a failover: a
        // refused connection costs the node nothing.
        let mut backoff = deadbolt_client::Backoff::new(
            std::time::Duration::from_millis(50),
            std::time::Duration::from_millis(250),
        );
        loop {
            let error = match self.connect().await {
                Err(error) if error.kind() == deadbolt_client::ErrorKind::Unavailable => error,
                connected => return connected,
            };
            let delay = backoff.next_delay(&mut rand::thread_rng());
            if give_up.is_none_or(|give_up| std::time::Instant::now() + delay >= give_up) {
                return Err(error);
            }
            tracing::debug!(%error, ?delay, "no endpoint answers; trying again");
            tokio::time::sleep(delay).await;
        }
    }

    /// One member, at the address the cluster lists it by.
    pub async fn connect_one(&self, address: &str) -> Result<Client, deadbolt_client::Error> {
        let token = self.access_token.as_deref();
        Client::connect_with_token([address], &self.tls, token).await
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a Deadbolt server node (single node by default, or a member of a
    /// 3- or 5-node cluster with --initial-cluster).
    Server(server::ServerArgs),
    /// Show or change the cluster's members.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Access control: tokens, roles of permissions on lock and key
    /// prefixes, and who holds them.
    #[command(subcommand)]
    Acl(acl::AclCommand),
    /// Run a command while holding a lock (distributed cron dedupe).
    #[command(after_help = AFTER_HELP)]
    Run(run::RunArgs),
    /// Run a command only while leading an election, and stop it before
    /// anyone else can be elected (`run --election`; docs/elections.md).
    #[command(after_help = AFTER_HELP)]
    Elect(run::ElectArgs),
    /// Who leads an election: session, term (its fencing token) and value.
    Leader(locks::LeaderArgs),
    /// Acquire a lock in a new session and print `SESSION TOKEN`, where
    /// SESSION is the session's handle (ID.SECRET), which `release` and
    /// `keepalive` take: keep it to yourself, whoever has it can release the
    /// lock.
    #[command(after_help = AFTER_HELP)]
    Acquire(locks::AcquireArgs),
    /// Release a lock taken with `deadbolt acquire`.
    Release(locks::ReleaseArgs),
    /// Renew the lease of a session opened with `deadbolt acquire`.
    Keepalive(locks::KeepaliveArgs),
    /// Show who holds a lock, with which token, and who waits.
    Status(locks::StatusArgs),
    /// Define a semaphore (it stays while unused), change its permits,
    /// delete it, or show it (docs/semaphores.md).
    #[command(subcommand)]
    Semaphore(semaphore::SemaphoreCommand),
    /// List held locks with holder, token and waiters.
    Locks(locks::ListArgs),
    /// Who held a lock, with which token, and how each grant ended.
    History(locks::HistoryArgs),
    /// Print a name's (or every name under a prefix's) grants, releases,
    /// queue changes, proclaims and store writes as they happen, each with
    /// its log index (docs/watches.md).
    Watch(watch::WatchArgs),
    /// Is TOKEN the current grant of LOCK? Exit 0 if so, 76 if not.
    Check(store::CheckArgs),
    /// The fenced store: values only the newest lock holder can change.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Measure throughput and latency against a running server.
    Bench(bench::BenchArgs),
    /// What each lock system `run --backend` and `bench --backend` can use
    /// guarantees: server crash, failover, client pause, token.
    Backends(backends::BackendsArgs),
    /// Create a CA and node or client certificates for TLS.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Make the cluster secret a plain-text cluster's nodes authenticate
    /// each other with (--peer-secret-file), or add one to rotate it.
    #[command(subcommand)]
    PeerSecret(peer_secret::PeerSecretCommand),
    /// Print this build's release and compatibility numbers (data format,
    /// backup format, peer protocol, client API; docs/upgrading.md).
    Version {
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check a stopped node's data directory without changing it.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Back up a running cluster, inspect a backup, restore one.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Live demonstrations of why fencing tokens matter.
    #[command(subcommand)]
    Demo(demo::DemoCommand),
    /// Internal: the process `deadbolt run` puts between itself and CMD.
    #[command(hide = true)]
    Guard(guard::GuardArgs),
}

/// Resolves with the signal's number on SIGINT (ctrl-c) or SIGTERM.
pub async fn stop_signal() -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).expect("cannot install the SIGINT handler");
    let mut terminate =
        signal(SignalKind::terminate()).expect("cannot install the SIGTERM handler");
    tokio::select! {
        _ = interrupt.recv() => libc::SIGINT,
        _ = terminate.recv() => libc::SIGTERM,
    }
}

/// `deadbolt --version`: the release and its compatibility numbers.
fn long_version() -> &'static str {
    static LONG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        deadbolt_server::version::describe(&deadbolt_server::version::build_versions())
    });
    &LONG
}

/// Parses human durations: `500ms`, `30s`, `5m`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

/// mimalloc rather than glibc's malloc, for the server above all. A node
/// runs its calls on one thread, and with 64 or 256 clients as many calls
/// are in flight, each with the same few allocations. glibc's per-thread
/// cache keeps 7 freed blocks of a size, so most of them took its slow path
/// (`_int_malloc`, `malloc_consolidate`). With mimalloc the allocator's
/// share of a pair at 256 clients fell from 5.2 to 2.2 µs, and the server's
/// CPU per uncontended pair by 7-11 % at 64 and 256 clients (none at 16),
/// the same client driving both. The price is memory: about a fifth more
/// RSS with many sessions (`bench/results/2026-12-05.md`, "mimalloc, a
/// fourth time").
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

fn main() {
    let command = <Cli as clap::CommandFactory>::command();
    let with_file = match config::with_config_file(&command, std::env::args_os().collect()) {
        Ok(with_file) => with_file,
        Err(err) => {
            eprintln!("deadbolt server: {err}");
            std::process::exit(exit::USAGE);
        }
    };
    let cli = match Cli::try_parse_from(&with_file.argv) {
        Ok(cli) => cli,
        Err(err) => match config::blame(&err, &with_file) {
            Some(message) => {
                eprintln!("deadbolt server: {message}");
                std::process::exit(exit::USAGE);
            }
            None => err.exit(),
        },
    };
    match cli.command {
        // No runtime, no threads: this process only waits and forwards.
        Command::Guard(args) => std::process::exit(guard::main(args)),
        // Offline: no server, no network.
        Command::Data(command) => std::process::exit(data::main(command)),
        Command::Certs(command) => std::process::exit(certs::main(command)),
        Command::PeerSecret(command) => std::process::exit(peer_secret::main(command)),
        Command::Version { json } => {
            let versions = deadbolt_server::version::build_versions();
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&versions).expect("serializable")
                );
            } else {
                println!("deadbolt {}", deadbolt_server::version::describe(&versions));
            }
            std::process::exit(exit::OK)
        }
        Command::Backends(args) => std::process::exit(backends::main(args)),
        _ => {}
    }
    if let Command::Snapshot(command) = &cli.command {
        if let Some(code) = snapshot::offline(command) {
            std::process::exit(code);
        }
    }
    let mut runtime = match &cli.command {
        Command::Server(args) => args.runtime(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = runtime
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime");
    let tls = TlsOptions::from_files(cli.ca.as_deref(), cli.cert.as_deref(), cli.key.as_deref());
    let endpoints = match tls {
        Ok(tls) => Endpoints {
            urls: cli.endpoint,
            tls,
            access_token: cli.access_token,
        },
        Err(err) => std::process::exit(exit::report(&err)),
    };
    let code = runtime.block_on(async move {
        let endpoint = &endpoints;
        match cli.command {
            Command::Server(args) => server::main(args).await,
            Command::Run(args) => run::main(endpoint, args).await,
            Command::Elect(args) => run::main(endpoint, args.into()).await,
            Command::Leader(args) => match &args.backend {
                Some(url) => run::backend::leader(url, &args.election, args.json).await,
                None => locks::leader(endpoint, args).await,
            },
            Command::Watch(args) => watch::main(endpoint, args).await,
            Command::Semaphore(command) => semaphore::main(endpoint, command).await,
            Command::Acquire(args) => locks::acquire(endpoint, args).await,
            Command::Release(args) => locks::release(endpoint, args).await,
            Command::Keepalive(args) => locks::keepalive(endpoint, args).await,
            Command::Status(args) => locks::status(endpoint, args).await,
            Command::Locks(args) => locks::list(endpoint, args).await,
            Command::History(args) => locks::history(endpoint, args).await,
            Command::Check(args) => store::check(endpoint, args).await,
            Command::Store(command) => store::main(endpoint, command).await,
            Command::Cluster(command) => cluster::main(endpoint, command).await,
            Command::Acl(command) => acl::main(endpoint, command).await,
            Command::Demo(command) => demo::main(command).await,
            Command::Bench(args) => bench::main(endpoint, args).await,
            Command::Snapshot(command) => snapshot::save(endpoint, command).await,
            Command::Guard(_)
            | Command::Data(_)
            | Command::Certs(_)
            | Command::PeerSecret(_)
            | Command::Version { .. }
            | Command::Backends(_) => {
                unreachable!("handled before the runtime starts")
            }
        }
    });
    // Do not wait for background tasks (a watchdog mid-backoff) on the way out.
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap checks a command line's definition only when it is parsed: a
    /// global `--key` whose id clashed with `store put KEY` panicked every
    /// `deadbolt store` call until this ran.
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        for args in [
            &["deadbolt", "store", "put", "k", "v", "--token", "1"][..],
            &["deadbolt", "--access-token", "dbt.a.b", "acl", "whoami"],
            &["deadbolt", "acl", "role", "put", "ci", "lock:jobs/", "read"],
            &[
                "deadbolt", "--ca", "ca.pem", "--key", "k.pem", "--cert", "c.pem", "status",
                "--lock", "l",
            ],
        ] {
            Cli::try_parse_from(args).unwrap_or_else(|err| panic!("{args:?}: {err}"));
        }
        // The server's own TLS flags are not the client's.
        let server = [
            "deadbolt",
            "server",
            "--tls-cert",
            "n.pem",
            "--tls-key",
            "n-key.pem",
        ];
        let cli = Cli::try_parse_from(server).unwrap();
        assert_eq!((cli.ca, cli.cert, cli.key), (None, None, None));
    }
}
