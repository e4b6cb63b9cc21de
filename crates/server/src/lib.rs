//! `deadbolt server`: the Raft-replicated lock service.
//!
//! Layers, outermost first:
//! - [`grpc`] and [`http`]: the two wire APIs, thin translations onto
//! - [`node::Node`]: the operations (open session, acquire, ...), which write
//!   through the [`proposer`] (group commit) into Raft and read the table;
//! - [`leases`]: keepalives and expiry on the leader, on a monotonic clock;
//! - [`metrics`]: what the node counts and times, for Prometheus;
//! - [`store`]: openraft's log and state machine on redb, around the pure
//!   `deadbolt_core::LockTable`.
//!
//! [`run`] wires them together and serves until the shutdown future resolves.

mod api;
mod auth;
mod backup;
mod calls;
mod clock;
mod cluster;
mod cluster_version;
mod dashboard;
pub mod embedded;
mod forward;
mod frames;
mod grpc;
mod handover;
mod http;
#[cfg(test)]
mod huge_lengths;
mod leases;
mod limits;
mod listener;
mod metrics;
mod network;
mod node;
mod proposer;
mod quiet_panic;
mod raft_types;
mod readiness;
mod runtime;
mod secret;
mod store;
#[cfg(test)]
mod testing;
mod tls;
pub mod untrusted;
pub mod version;
mod waits;
pub mod watches;

/// The release: the workspace's version (semver; `docs/upgrading.md`).
/// Here at the root, below everything that names it (the store's and the
/// backups' errors, `version.rs`'s numbers).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

pub use backup::{Backup, BadBackup, Summary as BackupSummary, MAX_FILE_BYTES as MAX_BACKUP_BYTES};
pub use cluster::InitialCluster;
pub use cluster_version::ASK_EVERY as CLUSTER_VERSION_ASK_EVERY;
pub use deadbolt_core::FeatureLevel;
pub use listener::ConnectionLimits;
pub use proposer::QueueLimits;
pub use secret::new_peer_secret;
pub use store::{check_data_dir, DataDirError, DataReport};
pub use tls::TlsFiles;

use anyhow::Context;

use auth::peers::{PeerAuthentication, PeerGate, PeerSecrets};
use clock::Clock;
use leases::Leases;
use node::{Node, Observers};
use openraft::network::RaftNetworkFactory;
use openraft::{BasicNode, Config, SnapshotPolicy};
use proposer::Proposer;
use raft_types::{NodeId, TypeConfig};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use store::{LogStore, StateMachineStore, StorageIo};
use tokio::sync::watch;
use waits::Waits;

/// Resolves if Raft stops by itself: a storage error (disk full, data
/// directory gone) is fatal to it, and a node whose Raft has stopped can only
/// answer errors, so it is better gone.
async fn raft_stopped(raft: openraft::Raft<raft_types::TypeConfig>) {
    // The server metrics change with the vote, state, leader or membership
    // only (`metrics()` changes with every commit, and this runs on the
    // main thread: a thread woken per batch). openraft drops their sender
    // when Raft stops, which ends the wait below.
    let mut metrics = raft.server_metrics();
    loop {
        if metrics.borrow_and_update().state == openraft::ServerState::Shutdown {
            return;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// How long a graceful shutdown waits for open requests to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Everything `deadbolt server` needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub node_id: u64,
    /// Serves gRPC and HTTP on the same port.
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Snapshot the lock table and compact the log every this many entries.
    pub snapshot_every: u64,
    /// How a node with an empty data directory finds its cluster.
    pub membership: StartMembership,
    /// Raft timing; see [`RaftTiming`].
    pub timing: RaftTiming,
    /// What one client can hold: connections, slow requests, streams.
    pub limits: ConnectionLimits,
    /// What may wait to be proposed before new work is refused `overloaded`.
    pub queue: QueueLimits,
    /// TLS for clients and peers; without it, plain HTTP/2.
    pub tls: Option<TlsFiles>,
    /// Serve plain text on a non-loopback address, knowingly.
    pub insecure: bool,
    /// Without TLS, the cluster secret file the peers authenticate with
    /// (`auth/peers.rs`); a plain-text cluster needs it.
    pub peer_secret_file: Option<PathBuf>,
    /// The highest feature level this node says it supports
    /// (`--max-feature-level`): its build's newest, or lower to hold the
    /// cluster version back (so that a rollback stays possible).
    pub feature_level: FeatureLevel,
}

/// How often the leader sends heartbeats, and how long a follower waits
/// without one before it stands for election (a random time between the
/// minimum and twice the minimum, so that one candidate usually wins).
/// Failover after a leader crash takes about one election timeout plus an
/// election round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftTiming {
    pub heartbeat: Duration,
    pub election_timeout: Duration,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat: Duration::from_millis(50),
            election_timeout: Duration::from_millis(150),
        }
    }
}

/// What a node with an empty data directory does. A node with data ignores
/// this: it rejoins the cluster recorded in its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMembership {
    /// Form a cluster of just this node (the default).
    SingleNode,
    /// Form the listed cluster together with the other listed nodes.
    Initial(InitialCluster),
    /// Wait to be added to a running cluster (`deadbolt cluster add`).
    Join,
}

impl ServerConfig {
    pub const DEFAULT_SNAPSHOT_EVERY: u64 = 10_000;
}

fn raft_config(snapshot_every: u64, timing: RaftTiming) -> anyhow::Result<Arc<Config>> {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let (heartbeat, election) = (millis(timing.heartbeat), millis(timing.election_timeout));
    // A heartbeat must arrive several times per election timeout, or a
    // healthy but briefly slow leader is voted out.
    anyhow::ensure!(
        heartbeat >= 1 && heartbeat.saturating_mul(3) <= election,
        "the election timeout ({election} ms) must be at least 3 heartbeat intervals ({heartbeat} ms)"
    );
    let config = Config {
        cluster_name: "deadbolt".into(),
        heartbeat_interval: heartbeat,
        election_timeout_min: election,
        election_timeout_max: election.saturating_mul(2),
        // Each entry is a batch of at most 4 MiB of commands (the proposer's
        // MAX_BATCH_BYTES): 8 of them stay well under the 64 MiB gRPC limit.
        max_payload_entries: 8,
        // The log stays bounded: at most about `snapshot_every` entries past
        // the latest snapshot, plus a few kept behind it for slow followers.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: (snapshot_every / 10).min(1_000),
        ..Default::default()
    };
    Ok(Arc::new(config.validate().context("invalid raft config")?))
}

/// How a node runs, besides its data and network: what the server and the
/// simulation choose differently.
struct NodeRun {
    clock: Clock,
    io: StorageIo,
    queue: QueueLimits,
    feature_level: FeatureLevel,
}

/// Opens a node's Raft log and state machine in `db` and starts Raft, with
/// `network` to reach its peers. Shared by the server and the simulation.
async fn open_node<N: RaftNetworkFactory<TypeConfig>>(
    id: NodeId,
    raft_config: Arc<Config>,
    data: store::OpenedData,
    network: N,
    NodeRun {
        clock,
        io,
        queue,
        feature_level,
    }: NodeRun,
    Transport {
        tls,
        peer_secrets,
        in_process,
    }: Transport,
) -> anyhow::Result<Node> {
    match &data.report {
        Some(report) => tracing::info!(
            log_last = report.log_last,
            snapshot_last = report.snapshot_last,
            next_token = report.next_token,
            sessions = report.sessions,
            locks = report.locks,
            "data checked: every record intact, nothing behind its witness"
        ),
        None => tracing::info!("new data directory"),
    }
    let db = Arc::new(data.db);
    let waits = Arc::new(Waits::default());
    let leases = Arc::new(Leases::new(clock));
    let metrics = Arc::new(metrics::Metrics::new(
        version::build_versions(),
        data.space.gauge(),
    ));
    let history = Arc::new(watches::History::default());
    let observers = Arc::new(Observers {
        waits: waits.clone(),
        leases: leases.clone(),
        metrics: metrics.clone(),
        history: history.clone(),
    });
    let state_machine = StateMachineStore::open(data.snapshots, io, observers, feature_level)
        .context("cannot load the snapshot from the data directory")?;
    let mut log_store = LogStore::new(
        db.clone(),
        data.log,
        data.witness,
        io,
        metrics.log_append_seconds(),
        state_machine.snapshot_on_disk(),
        data.space.clone(),
    );
    let appended = log_store.appended();
    let startup_log = node::StartupLog::read(&mut log_store)
        .await
        .context("cannot read the raft log")?;
    let table = state_machine.shared();
    let raft = openraft::Raft::new(id, raft_config, network, log_store, state_machine)
        .await
        .context("cannot start raft")?;
    Ok(Node {
        id,
        proposer: Proposer::start(
            raft.clone(),
            clock,
            metrics.clone(),
            queue,
            appended,
            io.appends_inline(),
            data.space.clone(),
        ),
        raft,
        table,
        waits,
        abandoned: Default::default(),
        leases,
        metrics,
        ready_to_join: Default::default(),
        tls,
        peer_secrets,
        in_process_peers: in_process,
        feature_level,
        member_levels: Default::default(),
        started_leading: Default::default(),
        history,
        startup_log: Arc::new(startup_log),
        space: data.space,
    })
}

/// Starts what a node does by itself, until `stopped`: following
/// leadership (lease tracking on and off, leader changes counted),
/// expiring leases, giving up abandoned acquires and raising the cluster
/// version.
fn spawn_duties(node: &Node, stopped: watch::Receiver<bool>) {
    runtime::spawn(node::acquire::give_up_abandoned(
        node.clone(),
        stopped.clone(),
    ));
    runtime::spawn(cluster_version::raise_when_supported(
        node.clone(),
        stopped.clone(),
    ));
    let leader = node.clone();
    runtime::spawn(leases::follow_leadership(
        node.raft.clone(),
        node.id,
        node.leases.clone(),
        node.waits.clone(),
        node.table.clone(),
        move || {
            leader.give_up_unclaimed_waits();
            leader.started_leading.notify_one();
        },
        stopped.clone(),
    ));
    runtime::spawn(metrics::count_leader_changes(
        node.raft.clone(),
        node.metrics.clone(),
        stopped.clone(),
    ));
    runtime::spawn(leases::expire_sessions(
        node.leases.clone(),
        node.proposer.clone(),
        stopped,
    ));
}

/// How a node authenticates clients and peers: the TLS files, or without
/// TLS the cluster secret, as loaded at start.
struct Transport {
    tls: Option<Arc<tls::NodeTls>>,
    peer_secrets: Option<Arc<PeerSecrets>>,
    /// An embedded node: its peers' messages never cross a wire.
    in_process: bool,
}

/// Loads the TLS files and the cluster secret, and refuses what would leave
/// the service open to anyone on the network: plain text on a non-loopback
/// address without `--insecure`, or a cluster whose peers could not
/// authenticate each other.
fn check_transport(config: &ServerConfig) -> anyhow::Result<Transport> {
    let loopback = config.listen.ip().is_loopback();
    let Some(files) = &config.tls else {
        if !loopback && !config.insecure {
            anyhow::bail!(
                "refusing to listen on {} without TLS: anyone who can reach it could release any \
                 lock. Give --tls-cert and --tls-key (and --tls-client-ca for a cluster; `deadbolt \
                 certs` makes them), or --insecure on a network you trust",
                config.listen
            );
        }
        let peer_secrets = match &config.peer_secret_file {
            Some(path) => {
                Some(Arc::new(PeerSecrets::load(path).map_err(|err| {
                    anyhow::anyhow!("refusing to start: {err}")
                })?))
            }
            None if config.membership != StartMembership::SingleNode => anyhow::bail!(
                "refusing to start a plain-text cluster node without --peer-secret-file: its \
                 peers would have no way to prove they are the cluster's nodes. `deadbolt \
                 peer-secret new FILE` makes one; give every node the same file (or run the \
                 cluster over TLS with --tls-client-ca)"
            ),
            None => None,
        };
        if !loopback {
            tracing::warn!(
                listen = %config.listen,
                "--insecure: serving plain text with no encryption: anyone who can watch this \
                 address's traffic can read tokens, session secrets and the cluster secret, and \
                 without access control (deadbolt acl bootstrap) anyone who can reach it can take \
                 or release any lock"
            );
        }
        return Ok(Transport {
            tls: None,
            peer_secrets,
            in_process: false,
        });
    };
    if config.peer_secret_file.is_some() {
        anyhow::bail!(
            "--peer-secret-file is for plain-text clusters: over TLS the peers authenticate with \
             node certificates (--tls-client-ca); drop one or the other"
        );
    }
    let tls = tls::NodeTls::load(files.clone())
        .map_err(|err| anyhow::anyhow!("refusing to start: {err}"))?;
    if config.membership != StartMembership::SingleNode && !tls.mutual() {
        anyhow::bail!(
            "a TLS cluster needs --tls-client-ca: its nodes authenticate each other with \
             certificates that CA signed (clients must then show one too)"
        );
    }
    Ok(Transport {
        tls: Some(Arc::new(tls)),
        peer_secrets: None,
        in_process: false,
    })
}

/// Refuses to restart a node whose data lists other members when its peers
/// would have no way to authenticate: it could take no part in its cluster.
fn check_peers_can_authenticate(node: &Node) -> anyhow::Result<()> {
    let initialized = node
        .raft
        .metrics()
        .borrow()
        .membership_config
        .nodes()
        .next()
        .is_some();
    if initialized
        && auth::peers::has_peers(&node.raft)
        && node.peer_authentication() == PeerAuthentication::Unavailable
    {
        let fix = if node.tls.is_some() {
            "--tls-client-ca (its peers authenticate with node certificates that CA signed)"
        } else {
            "--peer-secret-file, the same file on every node (`deadbolt peer-secret new FILE` \
             makes one; docs/security.md, \"Peers\", says how to move a running plain-text \
             cluster onto it)"
        };
        anyhow::bail!(
            "refusing to start: this node's data lists other members, and without {fix} none \
             of them could prove it is a peer"
        );
    }
    Ok(())
}

/// Reloads the files a SIGHUP reloads, the TLS certificates or the cluster
/// secret, until `stopped`. A file that is refused leaves the old ones in
/// use.
async fn reload_on_sighup(
    transport: Transport,
    mut hangups: tokio::signal::unix::Signal,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = hangups.recv() => {
                if let Some(tls) = &transport.tls {
                    match tls.reload() {
                        Ok(()) => tracing::info!("SIGHUP: reloaded the TLS certificates; new connections use them"),
                        Err(err) => tracing::error!(%err, "SIGHUP: the TLS files were refused; still using the ones loaded before"),
                    }
                }
                if let Some(secrets) = &transport.peer_secrets {
                    match secrets.reload() {
                        Ok(()) => tracing::info!(file = %secrets.path().display(), "SIGHUP: reloaded the cluster secret"),
                        Err(err) => tracing::error!(%err, "SIGHUP: the cluster secret file was refused; still using the secrets loaded before"),
                    }
                }
            }
            _ = stopped.wait_for(|stopped| *stopped) => return,
        }
    }
}

/// A server that has opened its data and bound its port, but is not yet
/// serving. Split from [`Server::serve`] so callers (and tests) can learn the
/// bound address first.
pub struct Server {
    listener: tokio::net::TcpListener,
    limits: ConnectionLimits,
    /// SIGHUPs, which reload the TLS files.
    hangups: Option<tokio::signal::unix::Signal>,
    node: Node,
    /// A cluster to form once this node serves (see [`cluster::form`]).
    forming: Option<InitialCluster>,
}

impl Server {
    pub async fn start(config: ServerConfig) -> anyhow::Result<Server> {
        let raft_config = raft_config(config.snapshot_every, config.timing)?;
        // Before anything is created: a list without this node is a typo
        // in the flags, whatever the data directory holds.
        if let StartMembership::Initial(cluster) = &config.membership {
            cluster::check_listed(config.node_id, cluster)?;
        }
        let transport = check_transport(&config)?;
        let hangups = (transport.tls.is_some() || transport.peer_secrets.is_some())
            .then(tls::hangups)
            .flatten();
        // Bind next: a port in use is the most common start-up failure and
        // should not wait for the data directory.
        let listener = listener::bind(config.listen, config.limits.backlog)
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let limits = listener::fit_open_file_limit(config.limits);
        let data =
            store::open_data_dir(&config.data_dir, config.node_id).context("refusing to start")?;
        let node = open_node(
            config.node_id,
            raft_config,
            data,
            network::PeerNetwork::new(
                config.timing.heartbeat,
                transport.tls.clone(),
                transport.peer_secrets.clone(),
            ),
            NodeRun {
                clock: Clock::host(),
                io: StorageIo::for_this_runtime(),
                queue: config.queue,
                feature_level: config.feature_level,
            },
            transport,
        )
        .await?;
        check_peers_can_authenticate(&node)?;
        tracing::info!(
            peers = node.peer_authentication().as_str(),
            "how peers authenticate (a node whose membership is itself alone serves no peer calls)"
        );
        let raft = node.raft.clone();
        // A restart finds the cluster in its data; only a new node needs this.
        let mut forming = None;
        if !raft.is_initialized().await? {
            match &config.membership {
                StartMembership::SingleNode => {
                    let address = listener.local_addr()?.to_string();
                    let members = BTreeMap::from([(config.node_id, BasicNode::new(address))]);
                    raft.initialize(members)
                        .await
                        .context("cannot initialize the cluster")?;
                    tracing::info!(
                        node_id = config.node_id,
                        "initialized a new single-node cluster"
                    );
                }
                StartMembership::Initial(cluster) => {
                    // Formed once serving: the peers must be able to ask
                    // this node how far it is, as it asks them.
                    forming = Some(cluster.clone());
                }
                StartMembership::Join => tracing::info!(
                    node_id = config.node_id,
                    "empty data directory: waiting to be added with `deadbolt cluster add`"
                ),
            }
        }
        Ok(Server {
            listener,
            limits,
            hangups,
            node,
            forming,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves, then stops accepting, ends blocked
    /// acquires, and shuts Raft down cleanly.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Server {
            listener,
            limits,
            hangups,
            node,
            forming,
        } = self;
        // Forming: no part in Raft before the node is ready to join.
        let ready_to_join = forming.is_some().then(|| node.ready_to_join.clone());
        let (refused_tx, refused) = tokio::sync::oneshot::channel();
        if let Some(cluster) = forming {
            let node = node.clone();
            tokio::spawn(async move {
                if let Err(err) = cluster::form(&node, &cluster).await {
                    let _ = refused_tx.send(err);
                }
            });
        }
        let (stop, stopped) = watch::channel(false);
        if let Some(hangups) = hangups {
            let transport = Transport {
                tls: node.tls.clone(),
                peer_secrets: node.peer_secrets.clone(),
                in_process: false,
            };
            tokio::spawn(reload_on_sighup(transport, hangups, stopped.clone()));
        }
        spawn_duties(&node, stopped);
        let in_flight = auth::InFlight::new(limits.max_calls_per_identity);
        let api = api::Api::new(node.clone(), secret::SecretSource::os(), in_flight);
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        tokio::spawn(readiness::report(
            node.clone(),
            health_reporter,
            stop.subscribe(),
        ));
        let peer_gate = PeerGate::new(
            node.raft.clone(),
            node.tls.clone(),
            node.peer_secrets.clone(),
            node.metrics.clone(),
        );
        let forwarder = forward::Forwarder::new(node.clone(), peer_gate.clone());
        let framed = frames::FramedCalls::new(api.clone(), stop.subscribe());
        let app = grpc::router(
            api.clone(),
            health_service,
            node.raft.clone(),
            ready_to_join,
            peer_gate,
            stop.subscribe(),
        )
        .merge(http::router(api, limits.body_read_timeout))
        .merge(dashboard::router(node.clone()))
        .fallback(http::unknown_path)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            forwarder,
            forward::forward_or_serve,
        ));
        tracing::info!(address = %listener.local_addr()?, "serving gRPC and HTTP");
        let waits = node.waits.clone();
        let history = node.history.clone();
        let mut stopping = stop.subscribe();
        let leaving = node.clone();
        let serving = listener::serve(
            listener,
            app,
            framed,
            limits,
            node.tls.clone(),
            async move {
                shutdown.await;
                tracing::info!("shutting down");
                // First, while this node still serves its clients and peers
                // (the new leader needs its vote), and then forwards calls to
                // the new leader.
                handover::hand_over(&leaving).await.report();
                let _ = stop.send(true);
                // Blocked acquires and watches would hold the graceful shutdown
                // open forever.
                waits.close();
                history.close();
            },
        );
        // Connections get a moment to finish their requests, not forever.
        let overdue = async move {
            let _ = stopping.wait_for(|stopping| *stopping).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        let raft_stopped = raft_stopped(node.raft.clone());
        tokio::select! {
            () = serving => {}
            () = overdue => tracing::warn!(
                "connections still open {SHUTDOWN_GRACE:?} after the shutdown signal; stopping anyway"
            ),
            Ok(err) = refused => return Err(err),
            () = raft_stopped => anyhow::bail!(
                "raft stopped on a fatal error (see the log above, e.g. a full disk, an unwritable data directory, \
                 or a failed fsync, which is never retried: the disk may have dropped what it could not write); \
                 this node serves nothing more. Check the disk (dmesg), then start the node again: it recovers \
                 from what is durable"
            ),
        }
        node.raft
            .shutdown()
            .await
            .context("raft did not shut down cleanly")?;
        tracing::info!("stopped");
        Ok(())
    }
}
