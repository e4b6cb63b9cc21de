//! [`Metrics`]: what a node tells Prometheus at `GET /metrics` (every metric
//! and what to alert on: docs/operations.md).
//!
//! Built on `prometheus-client`, the Prometheus project's own Rust client:
//! typed handles registered once in a per-node `Registry`, which a scrape
//! encodes in the Prometheus text format (0.0.4, what `promtool check
//! metrics` reads; the crate's OpenMetrics encoder names a counter's HELP and
//! TYPE lines without the `_total` its samples have, which Prometheus's text
//! parser takes for two metrics). Chosen over `metrics` +
//! `metrics-exporter-prometheus`, whose macros find the handle by name in one
//! process-wide recorder on every call: a hash and a map lookup per increment
//! unless each call site keeps its handle, and the nodes of one simulation
//! process would share one set of figures.
//!
//! The hot path stays lean: a counter or gauge is one atomic; a histogram
//! observation takes the histogram's own mutex for a few nanoseconds (never
//! across an await). Labelled series are created up front, so a request only
//! indexes an array: no lookup by label, no allocation.
//!
//! Where each figure is taken:
//! - **On apply, on every node**: grants, releases, sessions opened and
//!   expired, lease checkpoints, fenced-store writes. Every replica applies
//!   the same log, so every node reports the same cluster-wide counts (its
//!   own view of them, behind by its apply lag), and the series do not jump
//!   from one node to another when the leader changes. A restarted node
//!   counts the entries it re-applies after its snapshot again; for a rate
//!   that is just another counter reset.
//! - **Where the work happens**: keepalives, batches and commits on the
//!   leader (keepalives never reach the log); calls and errors on the node
//!   that answered them (a follower's `not_leader` refusals included); log
//!   appends and snapshots on each node's own disk.
//! - **At scrape time**: the gauges, read from the applied table, the
//!   proposal queue's count and openraft's metrics, so they cost the hot
//!   path nothing. Counting the queued waiters holds the table's read lock
//!   for O(sessions).
//!
//! Durations are measured on `std::time::Instant`: they decide nothing, so
//! they need not come from the node's [`crate::clock::Clock`].
//!
//! Its length (about 870 lines) is one registry: every family's registration
//! next to its typed handle and the label sets it counts by, so that a
//! metric's name, help and labels are read in one place (docs/operations.md
//! lists them from here).

use crate::raft_types::{BatchOutcome, NodeId, Raft};
use crate::store::SharedTable;
use crate::watches::History;
use deadbolt_core::{Event, LockError, Outcome, SessionEnd};
use deadbolt_proto::v1::BuildVersions;
use deadbolt_proto::ErrorKind;
use openraft::ServerState;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry, Unit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub use prometheus_text::CONTENT_TYPE;

/// Request latency, proposal commit: 0.5 ms (a batch on a fast disk) to
/// 16 s (past the proposer's 5 s commit wait).
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_5, 2.0, 16)
}

/// A blocked acquire's wait: 1 ms to about 27 minutes.
fn wait_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 3.0, 14)
}

/// Log appends (two fsyncs): 0.1 ms to 3.3 s, etcd's WAL fsync range and
/// below it for fast disks.
fn disk_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_1, 2.0, 16)
}

/// Commands per batch: 1 to the proposer's `MAX_BATCH` of 1024.
fn batch_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1.0, 2.0, 11)
}

/// Building a snapshot: 1 ms to about 4 minutes.
fn snapshot_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 4.0, 10)
}

/// An API call, as the `call` label of the request latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    OpenSession,
    KeepAlive,
    CloseSession,
    Acquire,
    Release,
    LockStatus,
    ListLocks,
    CheckToken,
    LockHistory,
    StorePut,
    StoreGet,
    StoreDelete,
    AddMember,
    RemoveMember,
    SetLimits,
    Proclaim,
    /// Starting a watch (its events are not calls).
    Watch,
    /// Defining or deleting a semaphore.
    DefineSemaphore,
}

impl Call {
    /// Every call, in declaration order: `ALL[call as usize] == call`.
    const ALL: [Call; 18] = [
        Call::OpenSession,
        Call::KeepAlive,
        Call::CloseSession,
        Call::Acquire,
        Call::Release,
        Call::LockStatus,
        Call::ListLocks,
        Call::CheckToken,
        Call::LockHistory,
        Call::StorePut,
        Call::StoreGet,
        Call::StoreDelete,
        Call::AddMember,
        Call::RemoveMember,
        Call::SetLimits,
        Call::Proclaim,
        Call::Watch,
        Call::DefineSemaphore,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Call::OpenSession => "open_session",
            Call::KeepAlive => "keep_alive",
            Call::CloseSession => "close_session",
            Call::Acquire => "acquire",
            Call::Release => "release",
            Call::LockStatus => "lock_status",
            Call::ListLocks => "list_locks",
            Call::CheckToken => "check_token",
            Call::LockHistory => "lock_history",
            Call::StorePut => "store_put",
            Call::StoreGet => "store_get",
            Call::StoreDelete => "store_delete",
            Call::AddMember => "add_member",
            Call::RemoveMember => "remove_member",
            Call::SetLimits => "set_limits",
            Call::Proclaim => "proclaim",
            Call::Watch => "watch",
            Call::DefineSemaphore => "define_semaphore",
        }
    }
}

/// One label with a fixed set of values.
type Label = [(&'static str, &'static str); 1];
/// The `peer` label: node ids are only known at run time.
type PeerLabel = [(&'static str, String); 1];

/// One node's metrics: the registry a scrape encodes, and the handles that
/// update it.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    grants: Counter,
    releases: Counter,
    sessions_opened: Counter,
    session_expiries: Counter,
    lease_checkpoints: Counter,
    lease_renewals: Counter,
    /// `[accepted, stale]`.
    fenced_writes: [Counter; 2],
    /// By [`Call`].
    call_seconds: Vec<Histogram>,
    /// By position in [`ErrorKind::ALL`].
    errors: Vec<Counter>,
    /// `[granted, not granted]`.
    acquire_wait_seconds: [Histogram; 2],
    batch_commands: Histogram,
    commit_seconds: Histogram,
    log_append_seconds: Histogram,
    snapshot_build_seconds: Histogram,
    snapshot_bytes: Gauge,
    leader_changes: Counter,
    /// By position in [`Refusal::ALL`].
    peer_calls_refused: Vec<Counter>,
    /// Client calls this node forwarded to the leader, by what became of
    /// them (`forward.rs`).
    forwarded_calls: Vec<Counter>,
    /// Framed-calls connections (`frames.rs`), by position in
    /// [`Welcome::ALL`].
    framed_connections: Vec<Counter>,
    sessions: Gauge,
    locks_held: Gauge,
    /// The cluster version the table is at (docs/upgrading.md): an upgrade
    /// is done once every member's is the newest `feature_level` of
    /// `deadbolt_build_info`.
    cluster_version: Gauge,
    /// Watches in progress, and the events kept for them (`watches.rs`).
    watches: Gauge,
    watch_events_kept: Gauge,
    /// The table's `max_sessions` and `max_locks` (`deadbolt cluster limits`).
    max_sessions: Gauge,
    max_locks: Gauge,
    lock_waiters: Gauge,
    term: Gauge,
    is_leader: Gauge,
    has_leader: Gauge,
    last_log_index: Gauge,
    applied_index: Gauge,
    apply_lag: Gauge,
    queued_commands: Gauge,
    replication_lag: Family<PeerLabel, Gauge>,
    /// The process's user and system CPU time (Prometheus's standard
    /// `process_cpu_seconds_total`): what `deadbolt bench` divides by the
    /// operations it made, CPU per operation being a figure that holds on
    /// a noisy machine where throughput does not (docs/performance.md).
    process_cpu: Counter<f64, AtomicU64>,
    /// The CPU time already counted, in microseconds: a scrape adds what
    /// has been used since.
    process_cpu_counted_us: AtomicU64,
}

/// Registers `metric` and returns the handle to update it with.
fn register<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: M,
) -> M {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric.clone()),
        None => registry.register(name, help, metric.clone()),
    }
    metric
}

/// Registers a family with one label and creates its series for `values`
/// now, so that updates index a vector and every series shows from the
/// first scrape (a rate over a series that appears late misses its start).
fn register_labelled<M>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    (key, values): (&'static str, &[&'static str]),
    new: fn() -> M,
) -> Vec<M>
where
    M: Metric + Clone + prometheus_client::metrics::TypedMetric,
{
    let family = register(
        registry,
        name,
        help,
        unit,
        Family::<Label, M, fn() -> M>::new_with_constructor(new),
    );
    values
        .iter()
        .map(|value| family.get_or_create_owned(&[(key, *value)]))
        .collect()
}

fn pair<M>(labelled: Vec<M>) -> [M; 2] {
    labelled.try_into().ok().expect("two label values")
}

/// `deadbolt_build_info`, always 1, with the release and its compatibility
/// numbers as labels (Prometheus's convention for what a build is): a
/// cluster's members can be told apart in one query during an upgrade.
fn register_build_info(registry: &mut Registry, versions: BuildVersions) {
    let labels = vec![
        ("release", versions.release),
        ("data_format", versions.data_format.to_string()),
        ("backup_format", versions.backup_format.to_string()),
        ("peer_protocol", versions.peer_protocol.to_string()),
        ("client_api", versions.client_api.to_string()),
        ("feature_level", versions.feature_level.to_string()),
    ];
    let info = register(
        registry,
        "deadbolt_build_info",
        "The release this node runs and its compatibility numbers (docs/upgrading.md), as labels; always 1",
        None,
        Family::<Vec<(&'static str, String)>, Gauge>::default(),
    );
    info.get_or_create(&labels).set(1);
}

impl Metrics {
    /// The registry, with `build` (`version::build_versions`) as the build
    /// information it reports.
    /// `disk_full` is the store's own gauge (`store::DiskSpace`): 1 while a
    /// write waits for space.
    pub fn new(build: BuildVersions, disk_full: Gauge) -> Metrics {
        let mut registry = Registry::default();
        let r = &mut registry;
        register(
            r,
            "deadbolt_disk_full",
            "1 while this node's disk is full: a write waits for space, and new writes are refused",
            None,
            disk_full,
        );
        let seconds = || Some(Unit::Seconds);
        let latency = || Histogram::new(latency_buckets());
        let wait = || Histogram::new(wait_buckets());
        let calls: Vec<&str> = Call::ALL.iter().map(|call| call.as_str()).collect();
        let kinds: Vec<&str> = ErrorKind::ALL.iter().map(|kind| kind.as_str()).collect();
        let refusals: Vec<&str> = Refusal::ALL.iter().map(|why| why.as_str()).collect();
        let forwarded: Vec<&str> = Forwarded::ALL.iter().map(|what| what.as_str()).collect();
        let welcomes: Vec<&str> = Welcome::ALL.iter().map(|what| what.as_str()).collect();
        register_build_info(r, build);
        Metrics {
            grants: register(
                r,
                "deadbolt_grants",
                "Locks granted (applied)",
                None,
                Counter::default(),
            ),
            releases: register(
                r,
                "deadbolt_releases",
                "Grants ended: released, or their session closed, expired or abandoned the acquire (applied)",
                None,
                Counter::default(),
            ),
            sessions_opened: register(
                r,
                "deadbolt_sessions_opened",
                "Sessions opened (applied)",
                None,
                Counter::default(),
            ),
            session_expiries: register(
                r,
                "deadbolt_session_expiries",
                "Sessions ended because their lease ran out (applied)",
                None,
                Counter::default(),
            ),
            lease_checkpoints: register(
                r,
                "deadbolt_lease_checkpoints",
                "Quiet sessions' remaining leases written to the log (applied, current ones only)",
                None,
                Counter::default(),
            ),
            lease_renewals: register(
                r,
                "deadbolt_lease_renewals",
                "Keepalives acknowledged by this node as leader",
                None,
                Counter::default(),
            ),
            fenced_writes: pair(register_labelled(
                r,
                "deadbolt_fenced_store_writes",
                "Fenced-store puts, deletes and fenced reads (applied), accepted or refused for a stale token",
                None,
                ("result", &["accepted", "stale"]),
                Counter::default,
            )),
            call_seconds: register_labelled(
                r,
                "deadbolt_request_duration",
                "API calls answered by this node, from arrival to answer (acquire includes its wait)",
                seconds(),
                ("call", &calls),
                latency,
            ),
            errors: register_labelled(
                r,
                "deadbolt_errors",
                "API calls this node answered with an error, by kind",
                None,
                ("kind", &kinds),
                Counter::default,
            ),
            acquire_wait_seconds: pair(register_labelled(
                r,
                "deadbolt_acquire_wait_duration",
                "How long blocking acquires waited in a lock's queue, by whether they got the lock",
                seconds(),
                ("result", &["granted", "not_granted"]),
                wait,
            )),
            batch_commands: register(
                r,
                "deadbolt_proposer_batch_commands",
                "Commands per log entry proposed by this node (group commit)",
                None,
                Histogram::new(batch_buckets()),
            ),
            commit_seconds: register(
                r,
                "deadbolt_proposal_commit_duration",
                "From proposing a batch to its being committed and applied on this leader",
                seconds(),
                latency(),
            ),
            log_append_seconds: register(
                r,
                "deadbolt_log_append_duration",
                "Raft log appends: the record written twice and fsync'd once",
                seconds(),
                Histogram::new(disk_buckets()),
            ),
            snapshot_build_seconds: register(
                r,
                "deadbolt_snapshot_build_duration",
                "Building and writing a snapshot of the lock table",
                seconds(),
                Histogram::new(snapshot_buckets()),
            ),
            snapshot_bytes: register(
                r,
                "deadbolt_snapshot_size",
                "Size of the latest snapshot this node built",
                Some(Unit::Bytes),
                Gauge::default(),
            ),
            leader_changes: register(
                r,
                "deadbolt_raft_leader_changes",
                "Times this node saw a new leader (the first one it saw included)",
                None,
                Counter::default(),
            ),
            peer_calls_refused: register_labelled(
                r,
                "deadbolt_peer_calls_refused",
                "Raft peer calls this node refused before reading them: it has no peers, or the caller is no node of its cluster",
                None,
                ("reason", &refusals),
                Counter::default,
            ),
            forwarded_calls: register_labelled(
                r,
                "deadbolt_forwarded_calls",
                "Client calls this node, not the leader, forwarded to the leader: answered there, failed to reach it (the caller heard unavailable), or served here because too many were in flight",
                None,
                ("result", &forwarded),
                Counter::default,
            ),
            framed_connections: register_labelled(
                r,
                "deadbolt_framed_connections",
                "Connections that asked for framed calls (docs/framed-calls.md): served, or refused because another node leads (the client then uses the gRPC Calls stream, which a follower forwards)",
                None,
                ("result", &welcomes),
                Counter::default,
            ),
            sessions: register(
                r,
                "deadbolt_sessions",
                "Live sessions in the applied table",
                None,
                Gauge::default(),
            ),
            locks_held: register(
                r,
                "deadbolt_locks_held",
                "Locks held in the applied table (those in lock-delay included)",
                None,
                Gauge::default(),
            ),
            cluster_version: register(
                r,
                "deadbolt_cluster_version",
                "The cluster version (feature level) of the applied table (docs/upgrading.md)",
                None,
                Gauge::default(),
            ),
            watches: register(
                r,
                "deadbolt_watches",
                "Watches this node serves now (docs/watches.md)",
                None,
                Gauge::default(),
            ),
            watch_events_kept: register(
                r,
                "deadbolt_watch_events_kept",
                "Events this node keeps for watches to read or resume from",
                None,
                Gauge::default(),
            ),
            max_sessions: register(
                r,
                "deadbolt_max_sessions",
                "The table's limit on live sessions (deadbolt cluster limits)",
                None,
                Gauge::default(),
            ),
            max_locks: register(
                r,
                "deadbolt_max_locks",
                "The table's limit on locks (deadbolt cluster limits)",
                None,
                Gauge::default(),
            ),
            lock_waiters: register(
                r,
                "deadbolt_lock_waiters",
                "Sessions queued for a lock in the applied table",
                None,
                Gauge::default(),
            ),
            term: register(
                r,
                "deadbolt_raft_term",
                "This node's current Raft term",
                None,
                Gauge::default(),
            ),
            is_leader: register(
                r,
                "deadbolt_raft_is_leader",
                "1 if this node is the Raft leader, else 0",
                None,
                Gauge::default(),
            ),
            has_leader: register(
                r,
                "deadbolt_raft_has_leader",
                "1 if this node knows a leader, else 0",
                None,
                Gauge::default(),
            ),
            last_log_index: register(
                r,
                "deadbolt_raft_last_log_index",
                "Index of the last entry in this node's log",
                None,
                Gauge::default(),
            ),
            applied_index: register(
                r,
                "deadbolt_raft_applied_index",
                "Index of the last entry applied to this node's lock table",
                None,
                Gauge::default(),
            ),
            apply_lag: register(
                r,
                "deadbolt_raft_apply_lag_entries",
                "Entries in this node's log not yet applied",
                None,
                Gauge::default(),
            ),
            queued_commands: register(
                r,
                "deadbolt_proposer_queued_commands",
                "Commands waiting to be proposed, past the batch being written; at \
                 --max-queued-commands new work is refused overloaded",
                None,
                Gauge::default(),
            ),
            replication_lag: register(
                r,
                "deadbolt_raft_replication_lag_entries",
                "On the leader: entries each follower has yet to acknowledge",
                None,
                Family::default(),
            ),
            process_cpu: register(
                r,
                "process_cpu",
                "User and system CPU time this process has used",
                seconds(),
                Counter::default(),
            ),
            process_cpu_counted_us: AtomicU64::new(0),
            registry,
        }
    }

    /// Counts what applying an entry produced.
    pub fn applied(&self, outcomes: &[BatchOutcome], events: &[Event]) {
        for outcome in outcomes.iter().flat_map(|batch| &batch.0) {
            let counter = match outcome {
                Ok(Outcome::LeaseCheckpointed { current: true }) => &self.lease_checkpoints,
                Ok(Outcome::Stored { .. } | Outcome::Deleted { .. } | Outcome::Read(_)) => {
                    &self.fenced_writes[0]
                }
                Err(LockError::StaleFence { .. } | LockError::NotCurrentGrant { .. }) => {
                    &self.fenced_writes[1]
                }
                _ => continue,
            };
            counter.inc();
        }
        for event in events {
            let counter = match event {
                Event::Granted { .. } => &self.grants,
                Event::Released { .. } => &self.releases,
                Event::SessionOpened { .. } => &self.sessions_opened,
                Event::SessionEnded {
                    how: SessionEnd::Expired,
                    ..
                } => &self.session_expiries,
                _ => continue,
            };
            counter.inc();
        }
    }

    pub fn peer_call_refused(&self, why: Refusal) {
        let index = Refusal::ALL.iter().position(|known| *known == why);
        self.peer_calls_refused[index.expect("every refusal is in Refusal::ALL")].inc();
    }

    pub fn call_forwarded(&self, what: Forwarded) {
        let index = Forwarded::ALL.iter().position(|known| *known == what);
        self.forwarded_calls[index.expect("every result is in Forwarded::ALL")].inc();
    }

    pub fn framed_connection(&self, welcome: Welcome) {
        let index = Welcome::ALL.iter().position(|known| *known == welcome);
        self.framed_connections[index.expect("every welcome is in Welcome::ALL")].inc();
    }

    pub fn lease_renewed(&self) {
        self.lease_renewals.inc();
    }

    /// Starts timing `call`; the time is recorded when the returned timer
    /// is dropped, also if the call's future is (its caller went away).
    pub fn call_started(&self, call: Call) -> CallTimer<'_> {
        CallTimer {
            histogram: &self.call_seconds[call as usize],
            started: Instant::now(),
        }
    }

    pub fn call_failed(&self, kind: ErrorKind) {
        let index = ErrorKind::ALL
            .iter()
            .position(|known| *known == kind)
            .expect("every kind is in ErrorKind::ALL");
        self.errors[index].inc();
    }

    pub fn acquire_waited(&self, waited: Duration, granted: bool) {
        let histogram = &self.acquire_wait_seconds[usize::from(!granted)];
        histogram.observe(waited.as_secs_f64());
    }

    pub fn batch_proposed(&self, commands: usize) {
        self.batch_commands.observe(commands as f64);
    }

    pub fn batch_committed(&self, took: Duration) {
        self.commit_seconds.observe(took.as_secs_f64());
    }

    /// The histogram of log appends, for the log store to observe.
    pub fn log_append_seconds(&self) -> Histogram {
        self.log_append_seconds.clone()
    }

    pub fn snapshot_built(&self, bytes: usize, took: Duration) {
        self.snapshot_build_seconds.observe(took.as_secs_f64());
        self.snapshot_bytes.set(gauge_value(bytes as u64));
    }

    /// The scrape: reads the gauges from their sources, then encodes
    /// everything in the Prometheus text format.
    pub fn render(
        &self,
        raft: &Raft,
        table: &SharedTable,
        queued_commands: usize,
        history: &History,
    ) -> String {
        self.queued_commands
            .set(gauge_value(queued_commands as u64));
        self.watches.set(gauge_value(history.watching() as u64));
        self.watch_events_kept
            .set(gauge_value(history.kept_events() as u64));
        {
            let applied = table.read().expect("state lock poisoned");
            let table = &applied.table;
            self.sessions.set(gauge_value(table.session_count() as u64));
            self.locks_held.set(gauge_value(table.lock_count() as u64));
            let limits = table.table_limits();
            self.max_sessions
                .set(gauge_value(limits.max_sessions as u64));
            self.max_locks.set(gauge_value(limits.max_locks as u64));
            self.lock_waiters
                .set(gauge_value(table.waits().count() as u64));
            self.cluster_version
                .set(gauge_value(u64::from(table.cluster_version().0)));
        }
        self.read_raft(raft);
        self.count_process_cpu();
        let mut text = String::new();
        prometheus_text::encode(&mut text, &self.registry)
            .expect("writing to a String never fails");
        text
    }

    /// Adds the CPU time used since the last scrape to `process_cpu`
    /// (the counter only goes up, and so does the process's CPU time).
    fn count_process_cpu(&self) {
        let time = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let used = time.tv_sec as u64 * 1_000_000 + time.tv_nsec as u64 / 1_000;
        let counted = self
            .process_cpu_counted_us
            .fetch_max(used, Ordering::Relaxed);
        if used > counted {
            self.process_cpu.inc_by((used - counted) as f64 / 1e6);
        }
    }

    fn read_raft(&self, raft: &Raft) {
        let receiver = raft.metrics();
        let raft = receiver.borrow();
        let last_log = raft.last_log_index.unwrap_or(0);
        let applied = raft.last_applied.map_or(0, |id| id.index);
        self.term.set(gauge_value(raft.current_term));
        self.is_leader
            .set(i64::from(raft.state == ServerState::Leader));
        self.has_leader
            .set(i64::from(raft.current_leader.is_some()));
        self.last_log_index.set(gauge_value(last_log));
        self.applied_index.set(gauge_value(applied));
        self.apply_lag
            .set(gauge_value(last_log.saturating_sub(applied)));
        // Only a leader has followers to report; a deposed one drops them.
        self.replication_lag.clear();
        let followers = raft.replication.iter().flatten();
        for (peer, matched) in followers.filter(|(peer, _)| **peer != raft.id) {
            let matched = matched.map_or(0, |id| id.index);
            self.replication_lag
                .get_or_create(&[("peer", peer.to_string())])
                .set(gauge_value(last_log.saturating_sub(matched)));
        }
    }
}

/// Indexes and sizes as a gauge's `i64` (never near its limit).
fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Times one API call; see [`Metrics::call_started`].
pub struct CallTimer<'a> {
    histogram: &'a Histogram,
    started: Instant,
}

impl Drop for CallTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// Counts the leaders this node sees come in, until `stopped`. A separate
/// task on openraft's server metrics (which change only with the vote,
/// state, leader or membership), so that a leader that comes and goes
/// between two scrapes still counts.
pub async fn count_leader_changes(
    raft: Raft,
    metrics: std::sync::Arc<Metrics>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut server = raft.server_metrics();
    let mut known: Option<NodeId> = None;
    loop {
        let leader = server.borrow_and_update().current_leader;
        if leader.is_some() && leader != known {
            metrics.leader_changes.inc();
        }
        known = leader;
        tokio::select! {
            changed = server.changed() => if changed.is_err() { return },
            _ = stopped.wait_for(|stopped| *stopped) => return,
        }
    }
}

// The label sets of the counters the layers above report to: defined
// here, below every layer that counts, so metrics imports none of them.

/// Why a peer call was refused: the label of the refusal metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This node has no peers, so serves no peer calls.
    NoPeers,
    /// Over TLS: no node certificate, or one `--peer-names` does not list.
    NotANode,
    /// Without TLS: no secret, or a wrong one.
    BadSecret,
    /// Without TLS, and this node was given no secret to check against.
    NoSecret,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::NoPeers,
        Refusal::NotANode,
        Refusal::BadSecret,
        Refusal::NoSecret,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoPeers => "no_peers",
            Refusal::NotANode => "not_a_node",
            Refusal::BadSecret => "bad_secret",
            Refusal::NoSecret => "no_secret",
        }
    }
}

/// What became of a call this node was asked to forward, for
/// `deadbolt_forwarded_calls_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    /// Sent to the leader; its answer went back to the caller.
    Answered,
    /// The leader could not be reached, or the connection broke before
    /// it answered: the caller heard `unavailable`.
    Failed,
    /// Past [`MAX_FORWARDED_IN_FLIGHT`](crate::forward::MAX_FORWARDED_IN_FLIGHT): served here (`not_leader`).
    ServedHere,
    /// The leader could not be connected to, so the call was never sent:
    /// answered `not_leader` once another node leads (or after
    /// [`LEADER_CHANGE_WAIT`](crate::forward::LEADER_CHANGE_WAIT)).
    LeaderUnreachable,
}

impl Forwarded {
    pub const ALL: [Forwarded; 4] = [
        Forwarded::Answered,
        Forwarded::Failed,
        Forwarded::ServedHere,
        Forwarded::LeaderUnreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Forwarded::Answered => "answered",
            Forwarded::Failed => "failed",
            Forwarded::ServedHere => "served_here",
            Forwarded::LeaderUnreachable => "leader_unreachable",
        }
    }
}

/// What a framed connection's hello was answered with, as counted in
/// `deadbolt_framed_connections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Welcome {
    Served,
    /// Another node leads (see [`Api::welcome_framed_calls`](crate::api::Api::welcome_framed_calls)).
    Refused,
}

impl Welcome {
    pub const ALL: [Welcome; 2] = [Welcome::Served, Welcome::Refused];

    pub fn as_str(self) -> &'static str {
        match self {
            Welcome::Served => "served",
            Welcome::Refused => "refused",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_listed_in_declaration_order() {
        for (index, call) in Call::ALL.iter().enumerate() {
            assert_eq!(*call as usize, index, "{call:?}");
        }
    }
}
